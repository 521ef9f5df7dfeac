"""Fault x where it strikes x outcome: does the chain keep its promise on a tiny BertModel?

    python benchmarks/fault_matrix.py [--faults raises,wrong] [--where compile,later]
                                      [--timeout 3] [--reverify-rate 0.005] [--calls 6]

Each cell builds a fresh chain(`faulty`, "eager") (no eager floor, so `faulty` wins when it
behaves at selection) where `faulty` is the graph's own forward with one fault injected at
one place, and calls the model at two sequence lengths (the second is dynamo's dynamic
recompile), first to select, then `--calls` times more (from 8 threads in the `threads`
column). A cell reads "right, recorded" when every call returned eager's answer, the
caller's input ids and the model's weights are unchanged, nothing raised, and the report
holds a non-winning attempt of `faulty` with its reason; else it says what went wrong.

Places: `compile` (the backend's compile), `first` (the runner's first call, during
selection), `timing` (its later calls during selection), `later` (calls after selection:
the guard and the run-time checks), `threads` (the same under 8 threads). `compile_timeout_s`
is set in every cell, so a hang during selection is abandoned; a hang after selection is
not: run-time calls have no timeout (README, "What cannot be interrupted").
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch import fx

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chain import chain
from chain.bench import zoo
from chain.run.watch import InputsWritten
from chain.select.isolation import WeightsDamaged

PLACES = ("compile", "first", "timing", "later", "threads")
HANG_S = 30.0


class Phase:
    """The caller's own input ids: a runner called on them runs for real (the guard's call),
    else it runs for selection (on the chain's copies: verification and timing)."""

    real: torch.Tensor | None = None


def _damage(fault: str, gm: fx.GraphModule, args: tuple[Any, ...], out: list[Any]) -> list[Any]:
    """`out` (the graph's right outputs) after `fault`; may also damage args or weights."""
    if fault == "raises":
        raise RuntimeError("injected fault: kernel launch failed")
    if fault == "exit":
        raise SystemExit(3)
    if fault == "hang":
        time.sleep(HANG_S)
        return out
    if fault == "wrong":
        return [o + 1.0 if o.is_floating_point() else o for o in out]
    if fault == "nan":
        return [torch.full_like(o, float("nan")) if o.is_floating_point() else o for o in out]
    if fault == "shape":
        return [o[..., :-1] if o.dim() else o for o in out]
    if fault == "scribble":  # zero every integer input (the caller's token ids), then answer
        with torch.no_grad():
            for a in args:
                if isinstance(a, torch.Tensor) and not a.is_floating_point():
                    a.zero_()
        return out
    if fault == "data":  # zero the caller's token ids (or their copy) behind the version counter
        real = Phase.real
        for a in args:  # the ids, or selection's copy of them (not the position_ids buffer)
            if real is not None and isinstance(a, torch.Tensor) and a.shape == real.shape:
                a.data.zero_()
        return out
    if fault == "weights":  # scale a weight in place behind the version counter, then answer
        with torch.no_grad():
            for a in args:
                if isinstance(a, torch.nn.Parameter):
                    a.data.mul_(2.0)
                    break
        return out
    raise ValueError(f"unknown fault {fault!r}")


FAULTS = ("raises", "exit", "hang", "wrong", "nan", "shape", "scribble", "data", "weights", "reuse")


def faulty(fault: str, place: str) -> Callable[..., Any]:
    """A backend: the graph's forward, with `fault` at `place`."""

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        if place == "compile":
            _damage(fault, gm, tuple(example_inputs), [])
        calls = {"select": 0, "run": 0}
        held: list[torch.Tensor] = []  # `reuse`: the one set of output tensors handed out

        def reused(out: list[Any]) -> list[Any]:
            if not held:
                held.extend(o.clone() for o in out)
            for buffer, o in zip(held, out, strict=True):
                buffer.copy_(o)
            return list(held)

        def run(*args: Any) -> Any:
            out = gm.forward(*args)
            if not any(a is Phase.real for a in args):
                calls["select"] += 1
                strike = (place == "first" and calls["select"] == 1) or (
                    place == "timing" and calls["select"] >= 2
                )
            else:
                calls["run"] += 1
                strike = place in ("later", "threads") and calls["run"] >= 2
            if strike and fault == "reuse":
                return reused(list(out))
            return _damage(fault, gm, args, list(out)) if strike else out

        return run

    backend.__name__ = "faulty"
    return backend


PRESCRIBED = ("weights", "scribble")  # write to the weights (scribble: the int buffers too)


def _prescribed(fault: str, place: str, exc: BaseException) -> str:
    """A WeightsDamaged / InputsWritten cell: the issue's prescribed error when the weights
    were damaged at run time (no copy is kept once a winner runs) and it names the backend."""
    text = str(exc)
    call = re.search(r"call (\d+)", text)
    named = text.startswith("faulty")
    if fault in PRESCRIBED and place in ("later", "threads") and named and call:
        return f"prescribed: {type(exc).__name__} naming faulty, at call {call.group(1)}"
    return f"RAISED {type(exc).__name__}: {text.splitlines()[0][:80]}"


def _answer(fast: Callable[..., Any], ids: torch.Tensor) -> Any:
    """The call's answer, or the WeightsDamaged it raised (kept: every later call counts)."""
    try:
        return fast(ids)
    except WeightsDamaged as exc:
        return exc


def cell(fault: str, place: str, timeout: float, rate: float, calls: int) -> str:
    """One cell's outcome in words."""
    if fault == "hang" and place in ("later", "threads"):
        return "n/a: run-time calls have no timeout"
    if fault == "reuse" and place == "first":
        return "n/a: one call hands nothing out twice"
    if fault in ("wrong", "nan", "shape", "reuse") and place == "compile":
        return "n/a: no output at compile"
    model = zoo.build("bert")
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    backend = chain(
        faulty(fault, place),
        "eager",
        compile_timeout_s=timeout,
        eager_floor=False,
        reverify_rate=rate,
        memory=False,
    )
    fast = torch.compile(model, backend=backend)
    wrong: list[str] = []
    try:
        for shape in (0, 1):
            (ids,) = zoo.inputs("bert", shape)
            kept = ids.clone()
            with torch.no_grad():
                expected = model(ids.clone())
                Phase.real = ids
                results = [fast(ids)]
                if place == "threads":

                    def one(_: int, ids: torch.Tensor = ids) -> Any:
                        with torch.no_grad():  # grad mode is per thread
                            return _answer(fast, ids)

                    with ThreadPoolExecutor(8) as pool:
                        results += list(pool.map(one, range(8 * calls)))
                else:
                    results += [_answer(fast, ids) for _ in range(calls)]
            damage = [r for r in results if isinstance(r, WeightsDamaged)]
            answers = [r for r in results if not isinstance(r, BaseException)]
            bad = sum(
                r.shape != expected.shape or not torch.allclose(r, expected, atol=1e-4)
                for r in answers
            )
            if damage:  # after WeightsDamaged every call must raise it, never answer
                after = results[results.index(damage[0]) :]
                answered = sum(not isinstance(r, BaseException) for r in after)
                return (
                    f"{_prescribed(fault, place, damage[0])}; then {len(after) - answered}/"
                    f"{len(after)} calls raised it, {bad} wrong answer(s)"
                )
            if bad:
                wrong.append(f"{bad}/{len(results)} wrong at {zoo.describe('bert', shape)}")
            if not torch.equal(ids, kept):
                wrong.append("input ids changed")
    except (WeightsDamaged, InputsWritten) as exc:  # the prescribed error, if it is one
        return _prescribed(fault, place, exc)
    except BaseException as exc:  # the cell's verdict: nothing may escape the model call
        return f"RAISED {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
    finally:
        Phase.real = None
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, weights[k])]
    if changed:
        wrong.append(f"weights changed ({changed[0]})")
    recorded = [
        a
        for g in backend.report.graphs
        for a in g.attempts
        if a.backend == "faulty" and a.status.value != "won" and a.reason
    ]
    if not recorded:
        wrong.append("not recorded")
    if wrong:
        return "; ".join(wrong)
    return f"right, recorded ({recorded[0].status.value})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--faults", default=",".join(FAULTS))
    p.add_argument("--where", default=",".join(PLACES))
    p.add_argument("--timeout", type=float, default=3.0, help="compile_timeout_s (default 3)")
    p.add_argument("--reverify-rate", type=float, default=0.005, help="the chain's default")
    p.add_argument("--calls", type=int, default=6, help="calls after selection per shape")
    args = p.parse_args(argv)
    faults = [f for f in args.faults.split(",") if f]
    places = [w for w in args.where.split(",") if w]
    for name in [*faults, *places]:
        if name not in (*FAULTS, *PLACES):
            p.error(f"unknown fault or place {name!r}: faults {FAULTS}, places {PLACES}")
    torch.set_num_threads(1)
    print(f"| fault | {' | '.join(places)} |")
    print(f"| --- |{' --- |' * len(places)}")
    for fault in faults:
        row = []
        for place in places:
            torch._dynamo.reset()
            row.append(cell(fault, place, args.timeout, args.reverify_rate, args.calls))
        print(f"| {fault} | {' | '.join(row)} |", flush=True)
    print(NOTES.format(rate=args.reverify_rate))
    return 0


NOTES = """
Notes. "prescribed": the weights were changed in place at run time (after selection no
copy of them is kept: a GPU model may not fit twice), so no backend can run on them; the
call raises WeightsDamaged naming the backend (`faulty, the winner (at run time, call N)`),
as the issue prescribes, and the graph moves on to the next backend for later calls. The
damage is caught at a sampled re-verification (each reads every weight's version counter
and the fingerprints of one eighth of the weights in turn, the first eighth first): the
fault strikes from the runner's 2nd call after selection, call 2 is always re-verified, and
the weight it scales is in the first eighth, so it is caught at the damaging call itself;
under 8 threads at the first re-verified call among those in flight. A fault that is only
wrong in value (`wrong`) is likewise caught at the next sampled re-verification (calls 2,
4, 8, ..., then at reverify_rate={rate} of run time): calls of other threads in flight
beside the first wrong one can return the wrong answer before the demotion (`threads`: 5
of 17 calls in one run of two, 0 in the other); `--reverify-rate 1` re-verifies every call.
`data` writes the caller's ids through `.data` (no version counter moves): caught at the
next re-verification, which compares the activations with a copy taken before the call and
restores them. `reuse` hands out one output buffer every call: caught at selection (called
twice after timing while its answer is held) or, striking later, at the second call whose
output is memory of an answer the caller still holds. After WeightsDamaged every call
raises it (`then N/M calls raised it`); under 8 threads the calls made between the damage
and the re-verification that sees it (the fault scales a weight on every call) answer from
the damaged weights: the sampled checks' limit.
Shape, dtype and aliasing faults are caught on every call (the cheap checks); NaN on every
call where the NaN/inf scan costs at most 0.25% of a call, else on a random sample of calls
(`scanned` on the record; on this model about a tenth) and at each re-verification."""


if __name__ == "__main__":
    raise SystemExit(main())
