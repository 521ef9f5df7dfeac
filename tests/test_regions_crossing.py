"""Crossing costs between backends (chain.select.regions.crossing), with a cost by design:
a callable that sleeps 2 ms whenever the call before it was another's (a runtime switch
that costs), so the measured figure has a floor that load cannot lower."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from chain.judge.timing import Timing
from chain.select.regions.crossing import all_crossings, crossing_costs, crossings_from

SWITCH_S = 2e-3


def backends() -> dict[str, Callable[..., Any]]:
    """`a` and `c` cost nothing; `b` sleeps SWITCH_S when the previous call was not b's."""
    last = [""]

    def make(name: str, switch_s: float) -> Callable[..., Any]:
        def run(*args: Any) -> None:
            if switch_s and last[0] != name:
                time.sleep(switch_s)
            last[0] = name

        return run

    return {"a": make("a", 0.0), "b": make("b", SWITCH_S), "c": make("c", 0.0)}


def test_a_switch_that_costs_shows_as_a_crossing_both_ways() -> None:
    fns = backends()
    costs = crossing_costs({k: fns[k] for k in ("a", "b")}, [], budget_s=0.2)
    assert set(costs) == {("a", "b"), ("b", "a")}
    assert costs[("a", "b")] >= SWITCH_S / 2 and costs[("b", "a")] >= SWITCH_S / 2


def test_one_backend_has_no_crossing() -> None:
    assert crossing_costs({"a": backends()["a"]}, [], budget_s=0.05) == {}


def test_pairs_never_run_together_get_the_dearest_measured_and_a_note() -> None:
    fns = backends()
    probes = [({k: fns[k] for k in ("a", "b")}, []), ({k: fns[k] for k in ("b", "c")}, [])]
    costs, notes = all_crossings(probes, budget_s=0.1)
    assert len(costs) == 6  # every ordered pair of a, b, c
    measured = [v for k, v in costs.items() if "a" not in k or "c" not in k]
    assert costs[("a", "c")] == costs[("c", "a")] == max(measured)
    assert notes and "a -> c" in notes[0] and "c -> a" in notes[0]


def _timing(rounds_ms: list[float]) -> Timing:
    ordered = sorted(rounds_ms)
    median = ordered[len(ordered) // 2]
    rounds_s = tuple(r / 1000 for r in rounds_ms)
    return Timing(median, 0.0, len(rounds_ms), 1.0, 1.0, 1.0, rounds_s=rounds_s)


def test_a_free_crossing_between_jittery_calls_is_not_taken_for_a_cost() -> None:
    """Recorded rounds on a busy machine: `a` takes 3 ms and, in some rounds, waits 6 ms
    more for a core; `b` costs nothing; the switch is free. Medians took the jitter for a
    3 ms crossing (and planned no mix); the quietest rounds see none."""
    timings = {
        "a>a": _timing([6.2, 12.2, 18.2, 12.2, 18.3, 12.2, 6.3, 18.1, 12.2]),
        "a>b": _timing([3.1, 9.1, 9.2, 3.1, 9.1, 9.2, 3.2, 9.1, 9.2]),
        "b>a": _timing([3.1, 3.1, 9.1, 3.2, 9.2, 3.1, 9.1, 3.1, 9.2]),
        "b>b": _timing([0.0] * 9),
    }
    costs = crossings_from(timings)
    assert set(costs) == {("a", "b"), ("b", "a")}
    assert max(costs.values()) < 0.2e-3, costs
