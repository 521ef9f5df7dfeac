"""Speed stays true at run time (issue 33): the pairs re-verification takes (the winner's
call, eager's run) demote a winner that turns slower than eager with confidence, and
never one within the noise."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import fx

from chain import Chain, GraphRecord, chain
from chain.report.records import Status
from chain.run.watch.pace import CONFIRM, MIN_PAIRS, Pace, slower
from tests.clock import WATCH, VirtualClock
from tests.models import build
from tests.timed import Captured, until_decided


def test_pairs_slower_with_confidence_give_the_reason() -> None:
    pairs = [(2e-3, 1e-3)] * MIN_PAIRS
    reason = slower(pairs)
    assert reason is not None and "2.000 ms against eager's 1.000 ms (0.50x)" in reason
    assert f"slower in {MIN_PAIRS} of its last {MIN_PAIRS}" in reason


@pytest.mark.parametrize(
    "pairs",
    [
        [(2e-3, 1e-3)] * (MIN_PAIRS - 1),  # too few to decide
        [(1.02e-3, 1e-3)] * 16,  # within the 3% margin
        [(2e-3, 1e-3), (0.5e-3, 1e-3)] * 8,  # turns: half slower, half faster
        [(1e-3 * (1 + (i % 3)), 1e-3 * (1 + ((i + 1) % 3))) for i in range(16)],  # noise
    ],
)
def test_pairs_within_the_noise_or_too_few_decide_nothing(pairs: list[tuple[float, float]]) -> None:
    assert slower(pairs) is None


def test_the_window_keeps_the_recent_pairs() -> None:
    pace = Pace()
    for _ in range(16):  # fast for a while
        assert pace.pair(0.5e-3, 1e-3) is None
    # then slow: caught once a window's worth of verdicts in a row says so (chain.run.watch.pace)
    reasons = [pace.pair(2e-3, 1e-3) for _ in range(16 + CONFIRM)]
    assert reasons[-1] is not None
    assert pace.pair(None, 1e-3) is None  # no winner figure (eager ran first, none settled)


def sleeps_after(
    calls: int, seconds: float, sleep: Callable[[float], None] = time.sleep
) -> Callable[..., Any]:
    """A backend: the graph's forward, `sleep`ing `seconds` a call after its first `calls`."""

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        count = [0]

        def run(*args: Any) -> Any:
            count[0] += 1
            if count[0] > calls:
                sleep(seconds)
            return gm.forward(*args)

        return run

    backend.__name__ = "turns_slow"
    return backend


def _turns_slow(backend: Chain | Captured, calls: int = 200) -> GraphRecord:
    """`calls` calls of the mlp compiled through `backend`, each checked against eager (the
    backends below re-verify every call: ~100 pairs, enough for `CONFIRM` verdicts in a row)."""
    model, (x,) = build("mlp")
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for _ in range(calls):
            torch.testing.assert_close(compiled(x), model(x))
    return backend.report.graphs[0]


def _demoted_as_slower(graph: GraphRecord) -> None:
    first = graph.attempts[0]
    assert (first.backend, first.status) == ("turns_slow", Status.SLOWER), first
    assert "slower than eager at run time" in first.reason
    assert graph.winner == "eager"


def test_a_winner_that_turns_slow_is_demoted_as_slower(
    guard_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the virtual clock the watch reads (tests/clock.py): 10 ms a call more than eager
    from its 4th call, whatever the machine's load."""
    clock = VirtualClock().install(monkeypatch, *WATCH)
    backend = chain(sleeps_after(3, 0.01, clock.sleep), "eager", measure=False,
                    reverify_rate=1.0)  # fmt: skip
    _demoted_as_slower(_turns_slow(backend))


def test_a_winner_as_fast_as_eager_stays(guard_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same winner without its delay: every pair a tie on the virtual clock, never a
    demotion (the demotion above is the delay's, not the watch's own cost)."""
    VirtualClock().install(monkeypatch, *WATCH)
    backend = chain(sleeps_after(3, 0.0, lambda s: None), "eager", measure=False,
                    reverify_rate=1.0)  # fmt: skip
    graph = _turns_slow(backend)
    assert graph.winner == "turns_slow" and graph.watch is not None
    assert graph.watch.reverified >= MIN_PAIRS


@pytest.mark.timing
def test_a_winner_that_turns_slow_is_demoted_on_the_real_clock() -> None:
    """The same on the real clock: 10 ms of sleep a call. Under load eager's run can take as
    long, and the pairs decide nothing: retried, then skipped with the load that did it."""

    def attempt() -> tuple[GraphRecord, list[tuple[float, float]]]:
        capture = Captured(chain(sleeps_after(3, 0.01), "eager", measure=False,
                                 reverify_rate=1.0))  # fmt: skip
        graph = _turns_slow(capture)
        pace = capture.guards[0].active.watch.pace if graph.winner != "eager" else None
        return graph, list(pace.pairs) if pace is not None else []

    def undecided(result: tuple[GraphRecord, list[tuple[float, float]]]) -> str | None:
        graph, pairs = result
        if graph.winner == "eager":
            return None
        assert slower(pairs) is None, "the pairs say slower, yet the winner was kept"
        behind = sum(w > e for w, e in pairs)
        return f"turns_slow kept: behind eager in {behind} of {len(pairs)} pairs"

    graph, _ = until_decided(attempt, undecided)
    _demoted_as_slower(graph)


def test_a_winner_demoted_at_run_time_forgets_its_stored_decision(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = VirtualClock().install(monkeypatch, *WATCH)
    model, (x,) = build("mlp")
    backend = chain(
        sleeps_after(3, 0.01, clock.sleep),
        "eager",
        measure=False,
        reverify_rate=1.0,
        store=str(tmp_path),
        memory=True,
    )
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        compiled(x)
        stored = list(tmp_path.glob("**/*.json"))
        assert len(stored) == 1, backend.report.graphs[0].notes  # the decision, remembered
        for _ in range(200):  # every call re-verified: ~100 pairs, whatever the load
            compiled(x)
    assert not stored[0].exists()
    notes = backend.report.graphs[0].notes
    assert any("forgotten: turns_slow demoted at run time" in n for n in notes), notes
