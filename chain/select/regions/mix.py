"""Mode `fastest` with `regions=True`: the graph cut into regions, each distinct region tried
under every candidate, the cheapest assignment (with measured crossings) stitched into
one callable, verified end to end against the graph's float64 reference and timed against
the whole-graph winner in one interleaved run; kept only when faster with confidence.
Whatever happens becomes the `regions` attempt with its reason; nothing escapes."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import fx
from torch._guards import compile_context, tracing

from backends.errors import one_line
from chain.judge.assign import Assignment, cheapest
from chain.judge.rounds import measure
from chain.judge.speed import EAGER, EAGER_REF, UNDECIDED_MORE, timed
from chain.judge.timing import FASTER, TimingError, compare
from chain.report.records import Attempt, Status
from chain.report.regions import REGIONS as REGIONS  # the attempt's name (re-exported)
from chain.select.attempt import Reference, failed_attempt
from chain.select.concrete import concretize
from chain.select.regions.crossing import all_crossings
from chain.select.regions.cut import Cut, Region, cut, regroup
from chain.select.regions.trials import Trial, trial
from chain.select.worker import timing_deadline

if TYPE_CHECKING:
    from chain.select.candidates import Selection

Fns = dict[str, Callable[..., Any]]


class Declined(Exception):
    """Mixing does not apply to this graph (one region, symbolic sizes...): the reason."""


def mix(
    selection: Selection,
    gm: fx.GraphModule,
    inputs: list[Any],
    reference: Reference,
    attempts: list[Attempt],
    fns: Fns,
) -> tuple[list[Attempt], Fns]:
    """`attempts` with the `regions` attempt added (and the winner changed when the mixed
    graph is faster with confidence); `fns` with the stitched callable when it passed."""
    start = time.perf_counter()
    winner = next((a.backend for a in attempts if a.status is Status.WON), EAGER)
    try:
        with _apart_from_dynamo():
            attempt, fn = _mixed(selection, gm, inputs, reference, winner, fns)
    except Declined as why:
        attempt, fn = Attempt(REGIONS, Status.UNSUPPORTED, str(why)), None
    except Exception as exc:  # a failure of mixing is a record, never the graph's crash
        if selection.speed.strict:
            raise
        attempt = failed_attempt(REGIONS, Status.COMPILE_ERROR, exc, "mixing failed: ")
        fn = None
    attempt = dataclasses.replace(attempt, compile_s=time.perf_counter() - start)
    if fn is None:
        return [*attempts, attempt], fns
    fns = {**fns, REGIONS: fn}
    if attempt.status is not Status.WON:
        return [*attempts, attempt], fns
    beaten = f"the mixed regions beat it: {attempt.latency_ms:.3f} ms vs its "
    return [
        dataclasses.replace(a, status=Status.SLOWER, reason=f"{beaten}{a.latency_ms or 0:.3f} ms")
        if a.status is Status.WON
        else a
        for a in attempts
    ] + [attempt], fns


@contextlib.contextmanager
def _apart_from_dynamo() -> Iterator[None]:
    """No dynamo tracing or compile context while regions compile: a region is a graph of
    its own, whose inputs dynamo never saw; compiled inside dynamo's context, a backend's
    shape guards on them land in dynamo's shape env without a source (measured: inductor on
    a ConvNeXt region made dynamo's guard building raise IndexError)."""
    with tracing(None), compile_context(None):
        yield


def _mixed(
    selection: Selection,
    gm: fx.GraphModule,
    inputs: list[Any],
    reference: Reference,
    winner: str,
    fns: Fns,
) -> tuple[Attempt, Callable[..., Any] | None]:
    """The `regions` attempt and its callable (None: it failed before it could run)."""
    _applies(inputs, reference)
    regions = cut(gm, reference.inputs())
    if len(regions.regions) < 2:
        raise Declined("one region: nothing to mix")
    trials = {}
    for region in regions.regions:  # one trial per structure
        if region.key not in trials:
            sub = regions.submodule(region)
            trials[region.key] = trial(selection, sub, list(regions.inputs[region.name]))
    costs = [trials[r.key].costs() for r in regions.regions]
    budget = selection.speed.budget_s
    probes = sorted(
        ((t, r) for r in regions.regions if (t := trials[r.key]).fns),
        key=lambda tr: tr[1].ops,
    )
    crossings, notes = all_crossings(
        [(_with_eager(t, regions.submodule(r)), regions.inputs[r.name]) for t, r in probes],
        budget,
    )
    plan = cheapest(costs, crossings)
    details = _details(regions, trials, plan, crossings, notes)
    if len(set(plan.backends)) == 1:
        why = (
            f"the cheapest assignment runs every region under {plan.backends[0]} "
            f"({1000 * plan.total:.3f} ms planned): nothing to mix; the whole graph kept"
        )
        return Attempt(REGIONS, Status.SLOWER, why, details=details), None
    stitched, details, _, wrong = _stitched(selection, gm, reference, regions, trials, plan,
                                            details)  # fmt: skip
    if wrong is not None:
        return wrong, None
    return _timed(selection, gm, reference, winner, fns, stitched, details)


def _stitched(
    selection: Selection,
    gm: fx.GraphModule,
    reference: Reference,
    regions: Cut,
    trials: dict[str, Trial],
    plan: Assignment,
    details: dict[str, Any],
) -> tuple[Callable[..., Any], dict[str, Any], list[str], Attempt | None]:
    """The plan's parts compiled and stitched into one callable; the details with the parts
    and who serves each; the backend per part; the mismatch attempt when the stitched graph
    fails end to end against the reference (None: it passed)."""
    whole, parts, served = _parts(selection, gm, reference, regions, trials, plan)
    details = {**details, "parts": [
        {"name": p.name, "path": p.path, "ops": p.ops, "backend": served[p.name]}
        for p in whole.regions
    ]}  # fmt: skip
    stitched = whole.with_calls(parts)
    ran = reference.inputs()
    with torch.no_grad():
        verdict = reference.verdict(stitched(*ran), ran)
    wrong = None
    if verdict.reason is not None:
        wrong = Attempt(REGIONS, Status.MISMATCH, f"end to end: {verdict.reason}",
                        error_type="Mismatch", details=details)  # fmt: skip
    return stitched, details, [served[p.name] for p in whole.regions], wrong


def rebuilt(
    selection: Selection,
    gm: fx.GraphModule,
    inputs: list[Any],
    reference: Reference,
    decided: Attempt,
) -> tuple[Attempt, Callable[..., Any] | None]:
    """A remembered mixed-regions winner (`decided`, its stored attempt) compiled again: the
    graph cut as it was, each part under the backend the plan gave it, verified end to end
    against the reference; nothing tried on the regions, nothing timed. A graph cut
    differently, a backend not in the chain, or a mismatch: (the attempt, None)."""
    start = time.perf_counter()
    try:
        with _apart_from_dynamo():
            attempt, fn = _rebuilt(selection, gm, inputs, reference, decided.details)
    except Declined as why:
        attempt, fn = Attempt(REGIONS, Status.UNSUPPORTED, str(why)), None
    except Exception as exc:  # a failure is a record (selection runs), never the graph's crash
        if selection.speed.strict:
            raise
        attempt = failed_attempt(REGIONS, Status.COMPILE_ERROR, exc, "mixing failed: ")
        fn = None
    return dataclasses.replace(attempt, compile_s=time.perf_counter() - start), fn


def _rebuilt(
    selection: Selection,
    gm: fx.GraphModule,
    inputs: list[Any],
    reference: Reference,
    details: dict[str, Any],
) -> tuple[Attempt, Callable[..., Any] | None]:
    """`rebuilt`'s work: the stored plan read and checked against the graph's cut (Declined
    with the reason when it does not fit), the parts compiled, stitched and verified."""
    _applies(inputs, reference)
    rows = details.get("regions")
    if not isinstance(rows, list) or not all(
        isinstance(r, dict) and isinstance(r.get("key"), str) and isinstance(r.get("backend"), str)
        for r in rows
    ):
        raise Declined("the remembered plan cannot be read (no regions with keys and backends)")
    regions = cut(gm, reference.inputs())
    if [r.key for r in regions.regions] != [r["key"] for r in rows]:
        raise Declined("the graph is cut into other regions than the remembered plan's")
    backends = tuple(r["backend"] for r in rows)
    names = {b.name for b in selection.backends} | {EAGER}
    if missing := sorted(set(backends) - names):
        raise Declined(f"the remembered plan names backends not in this chain: {missing}")
    plan = Assignment(backends, float(details.get("planned_ms") or 0.0) / 1000, 0.0)
    stitched, kept, served, wrong = _stitched(selection, gm, reference, regions, {}, plan,
                                              details)  # fmt: skip
    if wrong is not None:
        return wrong, None
    why = f"the remembered plan: {len(served)} parts ({', '.join(served)}), verified end to end"
    return Attempt(REGIONS, Status.WON, why, details=kept), stitched


def _applies(inputs: list[Any], reference: Reference) -> None:
    """Declined unless the graph has static sizes and its reference runs."""
    if concretize(inputs).symbolic:
        raise Declined("symbolic sizes (dynamic=True): regions are cut on static graphs only")
    if not reference.runnable or reference.unverified:
        raise Declined(reference.unverified or "the graph cannot be run here")


def _with_eager(t: Trial, sub: fx.GraphModule) -> Fns:
    """A trial's callables with eager's (the region's forward) among them."""
    return {**t.fns, EAGER: t.fn(EAGER, sub)}


def _groups(backends: tuple[str, ...]) -> list[int]:
    """A part number per region: consecutive regions under one backend share a part."""
    out, part = [], 0
    for i, backend in enumerate(backends):
        part += 1 if i and backend != backends[i - 1] else 0
        out.append(part)
    return out


def _placeholders(sub: fx.GraphModule) -> list[str]:
    return [n.name for n in sub.graph.nodes if n.op == "placeholder"]


def _parts(
    selection: Selection,
    gm: fx.GraphModule,
    reference: Reference,
    regions: Cut,
    trials: dict[str, Trial],
    plan: Assignment,
) -> tuple[Cut, Fns, dict[str, str]]:
    """The graph cut into parts (consecutive regions under one backend joined: one compile,
    one call), each compiled under its backend and verified on its own inputs; a part that
    fails is served by eager, with the reason. A part that is one region, the one its
    key's trial ran on, reuses the trial's callable."""
    groups = _groups(plan.backends)
    if len(set(groups)) == len(groups):
        whole = regions
    else:
        whole = regroup(gm, reference.inputs(), regions, groups)
    first: dict[int, int] = {}
    for i, g in enumerate(groups):
        first.setdefault(g, i)
    tried: dict[str, str] = {}  # key -> the region its trial ran on
    for r in regions.regions:
        tried.setdefault(r.key, r.name)
    by_name = {b.name: b for b in selection.backends}
    fns: Fns = {}
    served: dict[str, str] = {}
    for part, (g, i) in zip(whole.regions, first.items(), strict=True):
        backend, region = plan.backends[i], regions.regions[i]
        sub, alone = whole.submodule(part), regions.submodule(region)
        served[part.name] = backend
        reuse = groups.count(g) == 1 and tried[region.key] == region.name and region.key in trials
        if backend == EAGER:
            fns[part.name] = sub.forward
        elif reuse and _placeholders(sub) == _placeholders(alone):
            fns[part.name] = trials[region.key].fn(backend, alone)
        else:
            fns[part.name], why = _compile(selection, by_name[backend], sub, whole, part)
            if why is not None:
                served[part.name] = f"{EAGER} ({backend}: {why})"
    return whole, fns, served


def _compile(
    selection: Selection, backend: Any, sub: fx.GraphModule, regions: Cut, region: Region
) -> tuple[Callable[..., Any], str | None]:
    """`backend` on one region, verified on its inputs; eager with the reason if it fails."""
    inputs = list(regions.inputs[region.name])
    own = dataclasses.replace(selection, regions=False)
    ref, _ = own.reference(sub, inputs)
    attempt, fn = own.attempt(backend, backend, sub, inputs, ref)
    if fn is None:
        return sub.forward, f"{attempt.status.value}: {attempt.reason}"
    return fn, None


def _timed(
    selection: Selection,
    gm: fx.GraphModule,
    reference: Reference,
    winner: str,
    fns: Fns,
    stitched: Callable[..., Any],
    details: dict[str, Any],
) -> tuple[Attempt, Callable[..., Any] | None]:
    """The stitched graph timed against the whole-graph winner (and eager) in one run;
    WON only when faster than the winner with confidence."""
    speed = selection.speed
    whole = fns.get(winner, gm.forward) if winner != EAGER else gm.forward
    run = {EAGER_REF: gm.forward, REGIONS: stitched}
    baseline = EAGER_REF
    if whole != gm.forward:
        run[winner] = whole
        baseline = winner
    try:
        timings = measure(
            run, reference.inputs(), baseline=baseline,
            budget_s=speed.budget_s * (1 + UNDECIDED_MORE), stall_s=speed.stall_s,
            deadline=timing_deadline if speed.stall_s is not None else None,
        )  # fmt: skip
    except TimingError as err:
        why = f"while timed: {err.name} raised {one_line(err.exc)}"
        return Attempt(REGIONS, Status.RUNTIME_ERROR, why, details=details), None
    mine = timings[REGIONS]
    eager = timings[EAGER_REF]
    against_eager = dataclasses.replace(
        compare(eager.rounds_s, mine.rounds_s), evidence=mine.evidence
    )
    attempt = timed(Attempt(REGIONS, Status.WON, "", details=details), against_eager)
    name = "eager" if baseline == EAGER_REF else f"whole-graph {winner}"
    if mine.verdict == FASTER:  # against eager, the figures follow (SpeedRules.explained)
        why = f"faster than {name}: {mine.interval()}"
        if name == "eager":
            why = "eager won the whole graph; the mixed regions beat it"
        return dataclasses.replace(attempt, reason=why), stitched
    why = f"not faster than {name} with confidence ({mine.verdict}: {mine.interval()}): {name} kept"
    return dataclasses.replace(attempt, status=Status.SLOWER, reason=why), stitched


def _details(
    regions: Cut,
    trials: dict[str, Trial],
    plan: Assignment,
    crossings: dict[tuple[str, str], float],
    notes: list[str],
) -> dict[str, Any]:
    """What the report shows: each region (path, ops, key, its winner, every candidate's
    time on it or why it failed), the crossings, the plan."""
    rows = []
    for region, backend in zip(regions.regions, plan.backends, strict=True):
        t = trials[region.key]
        failed = {a.backend: f"{a.status.value}: {a.reason}" for a in t.attempts
                  if a.status not in (Status.WON, Status.SLOWER)}  # fmt: skip
        rows.append({
            "name": region.name, "path": region.path, "ops": region.ops, "key": region.key,
            "backend": backend, "crossing_in": region.crossing_in,
            "ms": {b: round(1000 * s, 6) for b, s in t.costs().items()}, "failed": failed,
        })  # fmt: skip
    return {
        "regions": rows,
        "unique": regions.unique,
        "crossings_ms": {f"{a} -> {b}": round(1000 * s, 6) for (a, b), s in crossings.items()},
        "planned_ms": round(1000 * plan.total, 6),
        "planned_crossings_ms": round(1000 * plan.crossings, 6),
        "notes": notes + [n for t in trials.values() for n in t.notes],
    }
