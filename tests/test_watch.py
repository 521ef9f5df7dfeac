"""Run time stays true (chain.run.watch): a winner caught wrong after selection is demoted with
the call number and the user gets the right answer; a fallback holds under threads; a write
is never applied twice."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import fx

from backends.errors import InvalidOption
from chain import Status, chain
from chain.bench import zoo
from chain.report.records import GraphRecord
from chain.run.watch import RunChecks
from chain.run.watch.schedule import AFTER, SETTLED, Schedule
from tests.clock import WATCH, VirtualClock
from tests.timed import Captured

pytestmark = pytest.mark.skipif(zoo.available() is not None, reason=str(zoo.available()))


class LaterWrong:
    """Right for selection and the first user call of each graph, then `spoil`s its outputs.

    Its runner counts its own calls: call 1 is the chain's verification at selection (the
    tests use measure=False), so run call k + 1 is the guard's call k.
    """

    def __init__(
        self,
        spoil: Callable[[int, tuple[Any, ...], list[Any]], list[Any]],
        cost: Callable[[], None] | None = None,
    ) -> None:
        self.spoil, self.cost = spoil, cost  # `cost`: called on each run (a virtual delay)
        self.__name__ = "later_wrong"

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        calls = 0

        def run(*args: Any) -> Any:
            nonlocal calls
            calls += 1
            if self.cost is not None:
                self.cost()
            out = list(gm(*args))
            return self.spoil(calls - 1, args, out) if calls > 2 else out

        return run


class Switch:
    """A backend that runs eager until `broken` is set, then raises on every call."""

    def __init__(self) -> None:
        self.broken = threading.Event()
        self.__name__ = "switch"

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            if self.broken.is_set():
                raise RuntimeError("engine lost its context")
            return gm(*args)

        return run


def _demoted(record: GraphRecord) -> str:
    """The reason of the graph's first attempt, which must be a run-time mismatch."""
    first = record.attempts[0]
    assert (first.backend, first.status) == ("later_wrong", Status.MISMATCH), record
    assert record.winner == "eager"
    return first.reason


def test_fallback_under_eight_threads_on_bert_at_two_shapes(guard_path: str) -> None:
    model = zoo.build("bert")
    shapes = [zoo.inputs("bert", s) for s in (0, 1)]
    switch = Switch()
    backend = chain(switch, "eager", measure=False)
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        expected = [model(*args) for args in shapes]
        for args in shapes:  # compile both graphs (static, then dynamic) before the threads
            compiled(*args)
        switch.broken.set()
        errors: list[BaseException] = []
        wrong: list[int] = []
        start = threading.Barrier(8)

        def work(t: int) -> None:
            try:
                start.wait()
                with torch.no_grad():  # grad mode is per thread: as when compiled
                    run(t)
            except BaseException as exc:  # every one is reported by the assert below
                errors.append(exc)

        def run(t: int) -> None:
            for k in range(5):
                s = (t + k) % 2
                if not torch.allclose(compiled(*shapes[s]), expected[s], atol=1e-5):
                    wrong.append(t)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == [] and wrong == []
    static, dynamic = backend.report.graphs  # dynamo tries the newest (dynamic) graph first
    assert static.winner == "switch"  # so the static one no longer runs
    for graph in [dynamic]:
        assert graph.winner == "eager"
        assert [(a.backend, a.status) for a in graph.attempts] == [
            ("switch", Status.RUNTIME_ERROR),
            ("eager", Status.WON),
        ]


def test_a_write_then_a_raise_is_applied_once() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return x * 2

    def raise_after_writing(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        calls = 0

        def run(*args: Any) -> Any:
            nonlocal calls
            calls += 1
            out = gm(*args)  # the write happens here
            if calls > 1:  # after selection's verified call
                raise RuntimeError("engine lost its context")
            return out

        return run

    backend = chain(raise_after_writing, "eager", measure=False)
    compiled = torch.compile(fn, backend=backend)
    for size in (4, 6):
        x = torch.zeros(size)
        out = compiled(x)
        assert torch.equal(x, torch.ones(size))  # incremented once
        assert torch.equal(out, torch.full((size,), 2.0))
    first = backend.report.graphs[0].attempts[0]
    assert first.status is Status.RUNTIME_ERROR


def _wrong_shape(call: int, args: tuple[Any, ...], out: list[Any]) -> list[Any]:
    return [o[..., :-1] for o in out]


def _other_dtype(call: int, args: tuple[Any, ...], out: list[Any]) -> list[Any]:
    return [o.double() for o in out]


def _input_as_output(call: int, args: tuple[Any, ...], out: list[Any]) -> list[Any]:
    return [args[0]]  # the graph is `x + 0`: same values, but it is the user's own tensor


@pytest.mark.parametrize(
    "spoil, reason",
    [
        (_wrong_shape, "at call 2: output 0 has shape (4, 15), eager (4, 16)"),
        (_other_dtype, "at call 2: output 0 has dtype torch.float64 where eager has torch.float32"),
        (_input_as_output, "at call 2: output 0 aliases input 0; eager's is fresh memory"),
    ],
)
def test_a_winner_wrong_later_is_demoted_with_the_call_number(
    spoil: Callable[..., list[Any]], reason: str, guard_path: str
) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x + 0

    backend = chain(LaterWrong(spoil), "eager", measure=False)
    compiled = torch.compile(fn, backend=backend)
    for _ in range(3):
        x = torch.randn(4, 16)
        out = compiled(x)
        assert torch.equal(out, x) and out.data_ptr() != x.data_ptr()
    [graph] = backend.report.graphs
    assert _demoted(graph) == reason
    assert graph.watch is not None and graph.watch.failures == [f"later_wrong {reason}"]


def test_a_wrong_shape_on_a_dynamic_graph_is_caught_against_this_calls_sizes(
    guard_path: str,
) -> None:
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, y], dim=0).view(-1)

    backend = chain(LaterWrong(_wrong_shape), "eager", measure=False)
    compiled = torch.compile(fn, backend=backend)
    for rows in (2, 3, 5, 7):  # 2: static graph; 3: dynamic; 5, 7: that dynamic graph again
        x, y = torch.randn(rows, 4), torch.randn(rows + 1, 4)
        assert torch.equal(compiled(x, y), fn(x, y))
    static, dynamic = backend.report.graphs
    assert _demoted(dynamic) == "at call 2: output 0 has shape (43,), eager (44,)"
    assert dynamic.watch is not None and dynamic.watch.unchecked == []
    assert static.winner == "later_wrong"  # called once: right every time it ran


def _every_third(call: int, args: tuple[Any, ...], out: list[Any]) -> list[Any]:
    return [torch.full_like(o, float("nan")) for o in out] if call % 3 == 0 else out


def test_nan_every_third_call_never_reaches_the_user_when_every_call_is_scanned(
    guard_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """reverify_rate=1 lets the NaN/inf scan take up to half a call: every call is scanned
    (on the virtual clock, a call of 10 ms and a scan of 1: a scan slowed by load would
    otherwise take more than half of a call and sample the calls)."""
    clock = VirtualClock().install(monkeypatch, *WATCH)
    model = zoo.build("bert")
    winner = LaterWrong(_every_third, lambda: clock.sleep(0.01))
    backend = chain(winner, "eager", measure=False, reverify_rate=1)
    compiled = torch.compile(model, backend=backend)
    args = zoo.inputs("bert", 0)
    with torch.no_grad():
        expected = model(*args)
        for _ in range(4):
            torch.testing.assert_close(compiled(*args), expected)
    [graph] = backend.report.graphs
    assert _demoted(graph).startswith("at call 3: output 0: ")
    assert "NaN value(s) where eager has none" in graph.attempts[0].reason
    assert graph.watch is not None and graph.watch.scanned == 1.0


def test_nan_every_third_call_is_caught_by_a_sampled_scan(guard_path: str) -> None:
    """Where the scan would cost more than its share of a call, a random quarter of the
    calls (here) is scanned: a NaN every third call is caught on the first scanned one, and
    every answer after it is right. The NaN calls before it reached the user (README)."""
    model = zoo.build("bert")
    backend = chain(LaterWrong(_every_third), "eager", measure=False, reverify_rate=0)
    # a quarter of the calls scanned, as measured on a graph of ~30 us
    capture = Captured(backend, lambda watch: setattr(watch, "scan_share", 0.25))
    compiled = torch.compile(model, backend=capture)
    args = zoo.inputs("bert", 0)
    with torch.no_grad():
        expected = model(*args)
        outs = [compiled(*args) for _ in range(60)]
    seen = [bool(out.isnan().any()) for out in outs]
    [graph] = backend.report.graphs
    call = int(_demoted(graph).split()[2].rstrip(":"))
    assert call % 3 == 0 and "NaN value(s) where eager has none" in graph.attempts[0].reason
    assert seen[: call - 1] == [(k + 1) % 3 == 0 for k in range(call - 1)]  # unscanned NaN
    for out in outs[call - 1 :]:  # the caught call and every one after: eager's answer
        torch.testing.assert_close(out, expected)
    assert call <= 60


def test_the_scan_takes_its_share_of_the_call() -> None:
    """The share of calls scanned follows the scan's measured cost over the call's: all of
    them when it is cheap, a sample when it is not, never fewer than the floor."""
    capture = Captured(chain(lambda gm, _: gm.forward, "eager", measure=False))
    torch.compile(lambda x: x * 2, backend=capture)(torch.randn(8))
    watch = capture.guards[0].active.watch
    assert watch.scan_budget == 0.0025  # the default reverify_rate 0.005: 0.25%
    watch.share_scans(scan_s=1e-6, call_s=1e-3)  # 0.1% of the call: every call
    assert watch.scan_share == 1.0
    watch.share_scans(scan_s=10e-6, call_s=400e-6)  # 2.5%: a tenth of the calls
    assert watch.scan_share == pytest.approx(0.1)
    watch.share_scans(scan_s=10e-6, call_s=10e-6)  # as long as the call: the floor
    assert watch.scan_share == 1 / 32 and watch.stats.scanned == 0.031


def test_calls_around_a_reverification_are_timed_and_booked(
    guard_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the calls the schedule asks for are timed (chain.run.watch.schedule): the few right
    after each re-verification, whose slowdown is booked to it, and one settled call before
    the next; the others run untimed, on either path."""
    timed: list[int] = []
    reverified: list[int] = []
    real_timed, real_done = Schedule.timed, Schedule.done

    def record_timed(self: Schedule, call: int, call_s: float) -> float:
        timed.append(call)
        return real_timed(self, call, call_s)

    def record_done(self: Schedule, call: int, cost_s: float, call_s: float) -> float:
        reverified.append(call)
        return real_done(self, call, cost_s, call_s)

    monkeypatch.setattr(Schedule, "timed", record_timed)
    monkeypatch.setattr(Schedule, "done", record_done)
    # the schedule places re-verifications by what the calls took: on the virtual clock the
    # same under any load (a preempted call read as the usual one moved them all)
    VirtualClock().install(monkeypatch, *WATCH)
    capture = Captured(chain(lambda gm, _: gm.forward, "eager", measure=False, reverify_rate=0.05))
    model = zoo.build("bert")
    compiled = torch.compile(model, backend=capture)
    with torch.no_grad():
        args = zoo.inputs("bert", 0)
        for _ in range(400):
            compiled(*args)
    schedule = capture.guards[0].active.watch.schedule
    assert len(reverified) >= 8 and timed
    settled = 0
    for call in timed:
        last = max(r for r in reverified if r < call)
        after = [r for r in reverified if r > call]
        following = after[0] if after else schedule.due
        if call - last >= SETTLED:  # a settled call: the one right before a re-verification
            assert call == following - 1, (call, reverified)
            settled += 1
        else:
            assert call - last <= AFTER, (call, reverified)
    assert settled >= 3 and schedule.cleans == settled
    assert len(timed) <= (AFTER + 1) * len(reverified)


def test_wrong_numbers_later_are_caught_by_reverification_every_call(guard_path: str) -> None:
    def off(call: int, args: tuple[Any, ...], out: list[Any]) -> list[Any]:
        return [o + 0.1 for o in out] if call >= 3 else out

    model = zoo.build("bert")
    backend = chain(LaterWrong(off), "eager", measure=False, reverify_rate=1)
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for shape in (0, 1, 1, 1):
            args = zoo.inputs("bert", shape)
            torch.testing.assert_close(compiled(*args), model(*args))
    static, dynamic = backend.report.graphs
    assert static.winner == "later_wrong" and static.watch is not None
    assert (static.watch.calls, static.watch.reverified) == (1, 0)  # call 1: verified at selection
    assert _demoted(dynamic).startswith("at call 3: output 0: RMSE vs float64")
    assert dynamic.watch is not None and (dynamic.watch.calls, dynamic.watch.reverified) == (3, 2)
    assert dynamic.watch.float64 == 1  # call 2 passed against eager alone; call 3 could not


def test_a_right_winner_is_reverified_against_eager_alone_at_two_shapes() -> None:
    """Within the bound eager's recorded error gives, a re-verification runs no float64
    (the float64 graph costs several eager calls): only the one eager run."""
    model = zoo.build("bert")
    backend = chain(lambda gm, _: gm.forward, "eager", measure=False, reverify_rate=1)
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for shape in (0, 1, 2, 1, 2):
            args = zoo.inputs("bert", shape)
            torch.testing.assert_close(compiled(*args), model(*args))
    static, dynamic = backend.report.graphs
    assert dynamic.watch is not None and dynamic.watch.failures == []
    assert (dynamic.watch.calls, dynamic.watch.reverified, dynamic.watch.float64) == (4, 3, 0)
    assert static.winner == dynamic.winner == "<lambda>"


@pytest.mark.parametrize("off", [0.0, 0.5])
def test_float64_at_run_time_sees_the_inputs_as_before_the_call(off: float) -> None:
    """A graph that writes its input, re-verified against float64 (no recorded error to
    pass by): float64 runs on the inputs as they were before the call, not as eager's run
    left them (a reference off by eager's write let a winner off by 0.5 pass), so a right
    winner stays and one off by 0.5 from its second call is caught there."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return x * 2

    winner = LaterWrong(lambda call, args, out: [o + off for o in out])
    backend = chain(winner, "eager", measure=False, reverify_rate=1)
    # no recorded error to pass by: float64 judges every re-verification
    capture = Captured(backend, lambda watch: setattr(watch, "recorded", None))
    compiled = torch.compile(fn, backend=capture, dynamic=False)
    x = torch.zeros(5)
    for k in range(1, 5):
        torch.testing.assert_close(compiled(x), torch.full((5,), 2.0 * k))
        assert torch.equal(x, torch.full((5,), float(k)))  # written once per call
    [graph] = backend.report.graphs
    assert graph.watch is not None
    if off:
        assert _demoted(graph).startswith("at call 2: output 0: RMSE vs float64")
        assert graph.watch.float64 == 1
    else:
        assert graph.watch.failures == [] and graph.winner == "later_wrong"
        assert (graph.watch.reverified, graph.watch.float64) == (3, 3)


def test_a_fresh_tensor_where_eager_returns_a_view_is_caught(guard_path: str) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x.transpose(0, 1)

    def copies(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        return lambda *args: [o.contiguous() for o in gm(*args)]  # ONNX Runtime does so

    backend = chain(copies, "eager", measure=False)
    compiled = torch.compile(fn, backend=backend)
    x = torch.randn(3, 4)
    out = compiled(x)
    out[0, 0] = 42.0  # eager's view writes through to x
    assert x[0, 0] == 42.0
    reason = backend.report.graphs[0].attempts[0].reason
    assert reason == "at call 1: output 0 does not alias input 0 as eager's does"


def test_onnxruntime_keeps_channels_last() -> None:
    """ONNX Runtime writes plain contiguous memory; its runner returns eager's channels_last
    layout, so it wins and is never demoted for the layout (it was, at call 1)."""
    pytest.importorskip("onnxruntime")
    conv = torch.nn.Conv2d(3, 4, 3, padding=1).eval()

    def fn(x: torch.Tensor) -> torch.Tensor:
        return conv(x)

    backend = chain("onnxruntime", "eager", measure=False)
    compiled = torch.compile(fn, backend=backend)
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    with torch.no_grad():
        for _ in range(3):
            out = compiled(x)
            assert out.is_contiguous(memory_format=torch.channels_last)
            torch.testing.assert_close(out, conv(x))
    [graph] = backend.report.graphs
    assert graph.winner == "onnxruntime" and graph.watch is not None
    assert (graph.watch.calls, graph.watch.failures) == (3, [])


def test_a_winner_that_later_drops_channels_last_is_caught(guard_path: str) -> None:
    """Right layout at selection, plain contiguous from its 3rd run (the user's 3rd call,
    the watch's 2nd: the 1st was answered by selection): caught at that call by the cheap
    checks, and eager answers it in eager's layout."""
    conv = torch.nn.Conv2d(3, 4, 3, padding=1).eval()
    calls = [0]

    def later_contiguous(gm: torch.fx.GraphModule, _: Any) -> Any:
        def run(*args: Any) -> Any:
            calls[0] += 1
            out = gm(*args)
            return [o.contiguous() for o in out] if calls[0] >= 3 else out

        return run

    def fn(x: torch.Tensor) -> torch.Tensor:
        return conv(x)

    backend = chain(later_contiguous, "eager", measure=False, reverify_rate=0.0)
    compiled = torch.compile(fn, backend=backend)
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    with torch.no_grad():
        for _ in range(3):
            out = compiled(x)
            assert out.is_contiguous(memory_format=torch.channels_last)
    first = backend.report.graphs[0].attempts[0]
    assert (first.backend, first.status) == ("later_contiguous", Status.MISMATCH)
    assert first.reason == "at call 2: output 0 is not channels_last as eager's is"


def test_checks_are_counted_on_the_record_and_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    VirtualClock().install(monkeypatch, *WATCH)  # calls 2, 4 and 8 under any load

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * 2

    backend = chain(lambda gm, _: gm.forward, "eager", measure=False)
    compiled = torch.compile(fn, backend=backend)
    for _ in range(9):
        compiled(torch.randn(8))
    [graph] = backend.report.graphs
    assert graph.watch is not None
    assert (graph.watch.calls, graph.watch.reverified, graph.watch.failures) == (9, 3, [])
    assert graph.watch.reverify_rate == 0.005  # the default: calls 2, 4 and 8 so far
    again = GraphRecord.from_dict(graph.to_dict())
    assert again.watch == graph.watch


def test_watch_false_checks_nothing_but_still_keeps_writes() -> None:
    backend = chain(LaterWrong(_other_dtype), "eager", measure=False, watch=False)
    compiled = torch.compile(lambda x: x + 0, backend=backend)
    for _ in range(2):
        compiled(torch.randn(4))
    [graph] = backend.report.graphs
    assert graph.winner == "later_wrong"
    assert graph.watch == RunChecks(unchecked=["run-time checks off: watch=False"])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"reverify_rate": 1.5}, "reverify_rate=1.5"),
        ({"reverify_rate": -0.01}, "reverify_rate=-0.01"),
        ({"reverify_rate": "1%"}, "reverify_rate='1%'"),
        ({"reverify_rate": float("nan")}, "reverify_rate=nan"),
        ({"watch": "yes"}, "watch='yes'"),
    ],
)
def test_watch_options_are_checked(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidOption, match=match):
        chain("eager", **kwargs)
