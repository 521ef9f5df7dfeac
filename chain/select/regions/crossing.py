"""What a crossing from one backend to another costs per call, measured: one region's
compiled callables called in pairs (a then b) in interleaved rounds (chain.judge.rounds);
a crossing a -> b costs what the pair takes beyond a's and b's own calls (a then a,
b then b), each at its quietest round, never below 0."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from chain.judge.rounds import measure
from chain.judge.timing import Timing

Pair = tuple[str, str]


def _pair(first: Callable[..., Any], second: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any) -> None:
        first(*args)
        second(*args)

    return run


def crossing_costs(
    fns: Mapping[str, Callable[..., Any]], inputs: Sequence[Any], budget_s: float
) -> dict[Pair, float]:
    """Seconds each crossing between two of `fns` (one region's compiled callables, by
    backend) adds per call, from one interleaved measurement of every ordered pair."""
    names = list(fns)
    if len(names) < 2:
        return {}
    pairs = {f"{a}>{b}": _pair(fns[a], fns[b]) for a, b in itertools.product(names, repeat=2)}
    baseline = f"{names[0]}>{names[0]}"
    return crossings_from(measure(pairs, list(inputs), baseline=baseline, budget_s=budget_s))


def crossings_from(timings: Mapping[str, Timing]) -> dict[Pair, float]:
    """Seconds per crossing from the timings of every ordered pair (`"a>b"`: a then b)."""
    names = [k.split(">")[0] for k in timings if k.split(">")[0] == k.split(">")[1]]
    least = {k: _least_s(t) for k, t in timings.items()}
    own = {n: least[f"{n}>{n}"] / 2 for n in names}  # seconds per call
    return {
        (a, b): max(0.0, least[f"{a}>{b}"] - own[a] - own[b])
        for a, b in itertools.permutations(names, 2)
    }


def _least_s(timing: Timing) -> float:
    """A pair's quietest round (seconds per call): load only ever adds time, and a crossing
    estimated from medians of calls that sleep or wait for a core took the load's jitter
    (milliseconds) for the crossing's cost (microseconds) and planned no mix."""
    return min(timing.rounds_s) if timing.rounds_s else timing.median_ms / 1000


def all_crossings(
    probes: Sequence[tuple[Mapping[str, Callable[..., Any]], Sequence[Any]]], budget_s: float
) -> tuple[dict[Pair, float], list[str]]:
    """Crossing costs between every two backends that ran some region: each pair measured
    on the first probe (a region's callables and inputs, smallest first) where both ran;
    a pair that never ran on one region together gets the dearest crossing measured (and
    a note saying so: the stitched graph's own timing decides in the end)."""
    names = list(dict.fromkeys(n for fns, _ in probes for n in fns))
    wanted = set(itertools.permutations(names, 2))
    out: dict[Pair, float] = {}
    for fns, inputs in probes:
        here = [n for n in fns if any(p in wanted - set(out) and n in p for p in wanted)]
        if any(a in here and b in here for a, b in wanted - set(out)):
            out.update(crossing_costs({n: fns[n] for n in here}, inputs, budget_s))
        if wanted <= set(out):
            break
    notes = []
    missing = sorted(wanted - set(out))
    if missing:
        dearest = max(out.values(), default=0.0)
        out.update({p: dearest for p in missing})
        pairs = ", ".join(f"{a} -> {b}" for a, b in missing)
        notes.append(f"crossings not measured ({pairs}): the dearest measured assumed")
    return out, notes
