"""Mixed regions as a challenger of the run-time race (issue 49 with issue 46): where the
selection could not keep the stitched graph (its timing not faster with confidence) and the
graph's decision races at run time, the stitched graph races with the other losers, and a
faster one is promoted; the answers stay the model's. The models, test backends and virtual
clock are tests/test_regions_mix.py's; the selection's verdict on the stitched graph is set
by the test, and its whole-graph timing reads a busy machine, so the graph races."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import chain.judge.rounds as rounds
import chain.select.regions.mix as mix
from chain.report.records import Attempt, Status
from chain.select.regions.mix import REGIONS
from tests.clock import VirtualClock
from tests.test_regions_mix import TwoTowers, check_calls, mixing_chain, quiet_clock

__all__ = ["quiet_clock"]  # the virtual clock, autouse: the rounds read it


@pytest.fixture
def raced(monkeypatch: pytest.MonkeyPatch, quiet_clock: VirtualClock) -> VirtualClock:
    """The stitched graph judged undecided at selection; the selection's rounds on a busy
    machine (noisy: the graph races); the race's pairs on the same clock, quiet."""

    def undecided(selection: Any, gm: Any, reference: Any, winner: Any, fns: Any, stitched: Any,
                  details: dict[str, Any]) -> tuple[Attempt, Any]:  # fmt: skip
        why = f"not faster than whole-graph {winner} with confidence (set by the test)"
        return Attempt(REGIONS, Status.SLOWER, why, details=details), stitched

    monkeypatch.setattr(mix, "_timed", undecided)
    monkeypatch.setattr(rounds, "load_average", lambda: 99.0)
    quiet_clock.install(monkeypatch, "chain.run.race")
    monkeypatch.setattr("chain.run.race.busy_now", lambda: False)
    monkeypatch.setattr("chain.run.race.compiles_running", lambda: ())
    return quiet_clock


@pytest.mark.parametrize("grad", [torch.no_grad, torch.inference_mode])
def test_the_stitched_graph_races_and_is_promoted(raced: VirtualClock, grad: Any) -> None:
    model = TwoTowers().eval()
    backend = mixing_chain()
    fast = torch.compile(model, backend=backend, dynamic=False)
    x = torch.randn(2, 16)
    with grad():
        want = model(x)
        fast(x)
    [record] = backend.report.graphs
    assert record.winner in ("drop_a", "drop_b"), record.attempts
    mixed = next(a for a in record.attempts if a.backend == REGIONS)
    assert mixed.status is Status.SLOWER
    assert record.race is not None and REGIONS in record.race.challengers, record.race
    with grad():
        for _ in range(3000):
            torch.testing.assert_close(fast(x), want, rtol=1e-5, atol=1e-5)
            if record.race.state in ("decided", "ended"):
                break
    promoted = [e for e in record.race.events if e.what == "promoted"]
    assert promoted and promoted[0].backend == REGIONS, record.race
    assert backend.report.graphs[0].winner == REGIONS
    check_calls(fast, model, grad)  # other lengths: graphs of their own, answered right
