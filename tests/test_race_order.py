"""The race times each contender as it serves (chain.run.race): the server first, in the
stream of its served calls, then the challenger after untimed runs of its own. Measured at
2 torch threads on a T5 encoder: ONNX Runtime (serving) read 0.130 ms when timed right after
an AOTInductor package's runs and 0.175 ms in its own stream, the package 0.14 ms either
way; with the order alternating, the pairs split by order and the race stayed undecided for
233 pairs. Virtual clock: the contenders' times are the test's, whatever the machine does."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from chain.judge import race
from tests.clock import VirtualClock
from tests.test_race import _serve_racing


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> VirtualClock:
    monkeypatch.setattr("chain.run.race.busy_now", lambda: False)
    monkeypatch.setattr("chain.run.race.compiles_running", lambda: ())
    return VirtualClock(tick_s=0.0).install(monkeypatch, "chain.run.race")


def _serve(clock: VirtualClock, times: dict[str, float], after_other: float, calls: int
           ) -> list[race.RaceEvent]:  # fmt: skip
    """Serve `calls` calls as the guard does, "server" racing "challenger": each takes its
    time in `times`, times `after_other` for the server when the challenger ran in the last 3
    runs (an effect of the order alone); the race's events."""
    runs: list[str] = []

    def contender(name: str) -> Any:
        def run(x: torch.Tensor) -> torch.Tensor:
            factor = after_other if name == "server" and "challenger" in runs[-3:] else 1.0
            runs.append(name)
            clock.sleep(times[name] * factor)
            return x * 2

        return run

    return _serve_racing({name: contender(name) for name in times}, calls)


def test_a_server_faster_right_after_the_challenger_is_timed_as_it_serves(
    clock: VirtualClock,
) -> None:
    """The server 0.175 ms in its stream, 0.130 ms right after the challenger; the challenger
    0.14 ms. Timed as they serve, the challenger is 1.25x faster and promoted."""
    events = _serve(clock, {"server": 0.175e-3, "challenger": 0.14e-3}, 0.130 / 0.175, 20_000)
    assert [(e.what, e.backend) for e in events][:1] == [("promoted", "challenger")], events
    assert "faster: 1.25x the server" in events[0].why


def test_a_server_slowed_by_the_challenger_does_not_promote_a_slower_one(
    clock: VirtualClock,
) -> None:
    """The challenger 5% slower; the server 1.3x slower right after the challenger ran (its
    threads, its caches): never promoted, and retired."""
    events = _serve(clock, {"server": 1e-3, "challenger": 1.05e-3}, 1.3, 40_000)
    assert not [e for e in events if e.what == "promoted"], events
    assert [(e.what, e.backend) for e in events] == [("retired", "challenger")], events


def test_a_challenger_that_needs_two_runs_to_warm_is_timed_warm(clock: VirtualClock) -> None:
    """A cache model: the challenger pays 30% more unless its last two runs were its own
    (the server's working set evicted its own). 1.25x faster warm: promoted, as it would
    serve, not retired on the handicap one untimed run leaves (chain.run.race.UNTIMED)."""
    runs: list[str] = []

    def contender(name: str, warm_s: float) -> Any:
        def run(x: torch.Tensor) -> torch.Tensor:
            cold = name == "challenger" and runs[-2:] != [name, name]
            runs.append(name)
            clock.sleep(warm_s * (1.3 if cold else 1.0))
            return x * 2

        return run

    fns = {"server": contender("server", 1e-3), "challenger": contender("challenger", 0.8e-3)}
    events = _serve_racing(fns, 20_000)
    assert [(e.what, e.backend) for e in events][:1] == [("promoted", "challenger")], events
    assert "faster: 1.25x the server" in events[0].why
