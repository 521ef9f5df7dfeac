"""The cheapest assignment of backends to a sequence of regions: a shortest path (dynamic
programming) over the regions, each step costing the region's latency under its backend
plus the crossing cost from the previous region's backend. Pure: costs in, path out."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Crossings = Mapping[tuple[str, str], float]  # (from, to) -> seconds added per call


@dataclass(frozen=True)
class Assignment:
    """A backend per region, the path's total cost, and how much of it is crossings."""

    backends: tuple[str, ...]
    total: float
    crossings: float

    @property
    def switches(self) -> int:
        """How many times the path changes backend."""
        return sum(a != b for a, b in itertools.pairwise(self.backends))


def crossing_cost(crossings: Crossings, a: str, b: str) -> float:
    """What going from a region under `a` to one under `b` adds: 0 within one backend; a
    pair never measured is an error (guessing would bias the path)."""
    if a == b:
        return crossings.get((a, b), 0.0)
    if (a, b) not in crossings:
        raise KeyError(f"no crossing cost measured from {a} to {b}")
    return crossings[(a, b)]


def cheapest(costs: Sequence[Mapping[str, float]], crossings: Crossings) -> Assignment:
    """The assignment of least total cost: each region's cost under its backend
    (`costs[i]`: backend -> seconds; a backend absent there cannot run region i) plus the
    crossing cost of each change. Ties go to the backend listed first, so the same costs
    always give the same path."""
    if not costs:
        raise ValueError("no regions to assign")
    for i, options in enumerate(costs):
        if not options:
            raise ValueError(f"region {i} has no backend that can run it")
    # best[b]: (cost of the cheapest path ending with b at this region, crossings on it, path)
    best: dict[str, tuple[float, float, tuple[str, ...]]] = {
        b: (c, 0.0, (b,)) for b, c in costs[0].items()
    }
    for options in costs[1:]:
        step: dict[str, tuple[float, float, tuple[str, ...]]] = {}
        for b, c in options.items():
            choice = None
            for a, (total, crossed, path) in best.items():
                x = crossing_cost(crossings, a, b)
                if choice is None or total + x < choice[0]:
                    choice = (total + x, crossed + x, path)
            if choice is None:
                raise ValueError("no path reaches this region")
            step[b] = (choice[0] + c, choice[1], (*choice[2], b))
        best = step
    total, crossed, path = min(best.values(), key=lambda v: v[0])
    return Assignment(path, total, crossed)
