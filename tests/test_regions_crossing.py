"""Crossing costs between backends (chain.select.regions.crossing), with a cost by design:
a callable that sleeps 2 ms whenever the call before it was another's (a runtime switch
that costs), so the measured figure has a floor that load cannot lower."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from chain.select.regions.crossing import all_crossings, crossing_costs

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
