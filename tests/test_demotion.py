"""A demotion at run time never raises into the caller's call: eager ends every re-selection
(whatever the chain lists), and the run-time speed check needs a window's worth of "slower"
verdicts in a row, so a winner no slower than eager is not demoted by a busy machine."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import fx

from chain import chain
from chain.report.records import Status
from chain.run.watch import pace
from chain.run.watch.pace import Pace
from tests.clock import WATCH, VirtualClock
from tests.models import build


def _bursty(seed: int, slow: float, pairs: int) -> int | None:
    """Feed `pairs` synthetic (winner, eager) timings to a Pace under bursty load (bursts
    of 1-30 pairs slowing each call independently up to several times, log-normal jitter);
    the winner `slow` times eager's true time. The pair at which it was demoted, or None."""
    draw = random.Random(seed)
    watch, burst = Pace(), 0
    for i in range(pairs):
        if draw.random() < 0.05:
            burst = draw.randint(1, 30)

        def call(busy: bool) -> float:
            load = 1 + draw.expovariate(0.5) if busy else 1.0
            return 1e-3 * load * draw.lognormvariate(0, 0.3)

        winner, eager = call(burst > 0) * slow, call(burst > 0)
        burst = max(0, burst - 1)
        if watch.pair(winner, eager) is not None:
            return i
    return None


@pytest.mark.parametrize("seed", range(40))
def test_a_winner_identical_to_eager_is_never_demoted_under_bursty_load(seed: int) -> None:
    assert _bursty(seed, 1.0, 1000) is None


@pytest.mark.parametrize("seed", range(10))
def test_a_winner_twice_as_slow_is_demoted_under_the_same_load(seed: int) -> None:
    at = _bursty(seed, 2.0, 400)
    assert at is not None and at >= pace.CONFIRM


def test_one_run_of_slower_verdicts_shorter_than_the_confirmation_demotes_nothing() -> None:
    watch = Pace()
    for _ in range(pace.MIN_PAIRS + 4):  # 5 "slower" verdicts, then a few while it fades
        assert watch.pair(2e-3, 1e-3) is None
    for _ in range(pace.WINDOW):  # back to eager's speed: the streak ends
        assert watch.pair(1e-3, 1e-3) is None
    verdicts = [watch.pair(2e-3, 1e-3) for _ in range(pace.WINDOW + pace.CONFIRM)]
    assert verdicts[-1] is not None


def slow_when(
    flag: list[bool], seconds: float, sleep: Callable[[float], None] = time.sleep
) -> Callable[..., Any]:
    """A backend: the graph's forward, sleeping `seconds` a call (by `sleep`) once `flag[0]`
    is set."""

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            if flag[0]:
                sleep(seconds)
            return gm.forward(*args)

        return run

    backend.__name__ = "turns_slow"
    return backend


def test_a_slow_winner_in_a_chain_without_eager_falls_to_eager_without_a_raise(
    guard_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the virtual clock (the winner eager plus 4 ms a call): a busy machine slowing
    eager's half of each pair cannot hide the slowdown, nor load fake one."""
    clock = VirtualClock().install(monkeypatch, *WATCH)
    model, (x,) = build("mlp")
    flag = [False]
    # measure=False: the winner is not timed at selection (a timed tie may go to the floor)
    backend = chain(slow_when(flag, 0.004, clock.sleep), measure=False, reverify_rate=1.0)
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        compiled(x)  # selected while as fast as eager
        flag[0] = True
        for _ in range(200):  # every call re-verified: ~100 pairs, whatever the load
            torch.testing.assert_close(compiled(x), model(x))
    graph = backend.report.graphs[0]
    first = graph.attempts[0]
    assert (first.backend, first.status) == ("turns_slow", Status.SLOWER), graph.attempts
    assert graph.winner == "eager"


def raises_after_first_run(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Right at selection, then raises on every call."""
    count = [0]

    def run(*args: Any) -> Any:
        count[0] += 1
        if count[0] > 1:
            raise RuntimeError("kernel launch failed")
        return gm.forward(*args)

    return run


def test_a_winner_failing_at_run_time_with_no_later_backend_is_answered_by_eager() -> None:
    model, (x,) = build("mlp")
    backend = chain(raises_after_first_run, measure=False, eager_floor=False)
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model(x))
    graph = backend.report.graphs[0]
    assert graph.attempts[0].status is Status.RUNTIME_ERROR
    assert graph.winner == "eager"
    assert "last resort at run time" in graph.winning_attempt.reason
