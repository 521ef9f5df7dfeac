"""ONNX Runtime's intra-op threads on CPU, measured per graph (backends.onnxruntime.threads):
one thread where it is faster with confidence, ORT's default otherwise.

The decision's tests run sessions whose calls cost set times on a virtual clock
(tests/clock.py), so they come out the same on a loaded machine; the chain's test runs the
real thing and asserts what is true either way: the answers, and that the report says
which count serves and why.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch

from backends import Unsupported
from backends.onnxruntime import threads
from backends.onnxruntime.artefact import to_artefact
from backends.onnxruntime.threads import MARGIN, ROUNDS, SLOW_MS, choose
from chain import chain
from tests.clock import VirtualClock
from tests.models import build_extra

MODES: dict[str, Callable[[], Any]] = {
    "inference_mode": torch.inference_mode,
    "no_grad": torch.no_grad,
}


class Session:
    """A session whose run costs `costs` seconds in turn (cycled) on the virtual clock."""

    def __init__(self, clock: VirtualClock, *costs: float) -> None:
        self.clock, self.costs, self.runs = clock, itertools.cycle(costs), 0

    def run(self, names: Any, feeds: Any) -> list[Any]:
        self.runs += 1
        self.clock.sleep(next(self.costs))
        return []


def decide(
    monkeypatch: pytest.MonkeyPatch,
    default_s: tuple[float, ...],
    one_s: tuple[float, ...],
    load: float = 0.0,
) -> tuple[threads.Choice, bool, Session | None]:
    """`choose` between sessions of those costs, the machine's load average `load`: (the
    choice, whether the one-thread session serves, that session if it was built)."""
    clock = VirtualClock(tick_s=0.0).install(monkeypatch, "backends.onnxruntime.threads")
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (load, load, load))
    graph = type("G", (), {"output_names": ("y",), "input_names": (), "input_positions": (),
                           "carrier_names": (), "carriers": ()})()  # fmt: skip
    default = Session(clock, *default_s)
    built: list[Session] = []

    def one_thread() -> Session:
        built.append(Session(clock, *one_s))
        return built[0]

    choice, serving = choose(graph, [], default, one_thread)  # type: ignore[arg-type]
    return choice, serving is not default, built[0] if built else None


def test_one_thread_faster_with_confidence_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    choice, single, _ = decide(monkeypatch, (0.5e-3,), (0.4e-3,))
    assert (choice.threads, single, choice.stored) == (1, True, 1)
    assert f"faster in {ROUNDS} of {ROUNDS} rounds" in choice.why and "1.25x" in choice.why


@pytest.mark.parametrize(
    ("one_s", "why", "stored"),
    [
        ((0.6e-3,), "0.83x", 0),  # slower with confidence: the default, remembered
        ((0.5e-3 / (MARGIN - 0.02),), "faster in 15 of 15", None),  # under the margin
    ],
    ids=["slower", "within-the-margin"],
)
def test_otherwise_the_default_stays(
    monkeypatch: pytest.MonkeyPatch, one_s: tuple[float, ...], why: str, stored: int | None
) -> None:
    """The default serves; only a verdict against one thread is kept with the export (0),
    a tie is timed again at the next start (None)."""
    choice, single, _ = decide(monkeypatch, (0.5e-3,), one_s)
    assert (choice.threads, single, choice.stored) == (None, False, stored)
    assert choice.why.startswith("ORT's default kept") and why in choice.why


@pytest.mark.parametrize(("one_s", "threads_kept"), [((0.4e-3,), 1), ((0.6e-3,), None)])
def test_a_verdict_on_a_machine_with_no_core_free_serves_but_is_not_stored(
    monkeypatch: pytest.MonkeyPatch, one_s: tuple[float, ...], threads_kept: int | None
) -> None:
    """The same clear verdicts as above, with the load average at the core count: the
    count serves this process, and nothing is stored with the export."""
    import os

    choice, _, _ = decide(monkeypatch, (0.5e-3,), one_s, load=float(os.cpu_count() or 1))
    assert (choice.threads, choice.stored) == (threads_kept, None)
    assert "not stored with the export" in choice.why


def test_a_noisy_timing_keeps_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """One thread 1.3x faster in most blocks, but a busy machine slows some of its blocks
    3x: too few rounds won for the sign test, so ORT's default stays."""
    default = (0.5e-3,)
    # the one-thread session's calls: a slow stretch now and then, long enough to spoil
    # a whole block in 5 of 15 rounds
    one = tuple([0.38e-3] * 20 + [1.5e-3] * 10)
    choice, single, _ = decide(monkeypatch, default, one)
    assert (choice.threads, single, choice.stored) == (None, False, None), choice.why
    assert "of 15 rounds" in choice.why


def test_a_slow_graph_is_not_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A call over SLOW_MS: no second session is built, ORT's default serves."""
    choice, single, built = decide(monkeypatch, (2 * SLOW_MS / 1000,), (0.1e-3,))
    assert (choice.threads, single, built, choice.stored) == (None, False, None, None)
    assert "not timed" in choice.why


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
@pytest.mark.parametrize("mode", list(MODES))
def test_the_chain_serves_the_chosen_session_and_says_which(
    mode: str, dynamic: bool | None
) -> None:
    """A tiny BERT through ONNX Runtime, two lengths, then a weight update: every answer is
    eager's, each graph's attempt names the thread count and why; a count the user pins is
    never second-guessed."""
    model, _ = build_extra("bert")
    measured = chain("onnxruntime", "eager", measure=False)
    pinned = chain("onnxruntime", "eager", measure=False,
                   options={"onnxruntime": {"intra_op_num_threads": 1}})  # fmt: skip
    compiled = [torch.compile(model, backend=c, dynamic=dynamic) for c in (measured, pinned)]

    def check() -> None:
        with MODES[mode]():
            for n in (7, 12, 7, 12):
                x = torch.randint(0, 100, (2, n), generator=torch.Generator().manual_seed(n))
                want = model(x).last_hidden_state
                for fn in compiled:
                    torch.testing.assert_close(fn(x).last_hidden_state, want)

    check()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.9)
    check()
    for graph in measured.report.graphs:
        details = graph.winning_attempt.details
        assert details["intra_op_threads"] in (1, "default")
        assert (
            "rounds" in details["intra_op_threads_why"]
            or "not timed" in details["intra_op_threads_why"]
        )
    for graph in pinned.report.graphs:
        assert "intra_op_threads" not in graph.winning_attempt.details


def test_timing_a_size_carrier_does_not_make_dynamo_compile_again() -> None:
    """A graph that takes an int no tensor size carries (fed as a size carrier): the timing
    reads the int's hint, never `int()` of it, which would make dynamo guard on its value
    and compile the graph again for every other one (it did: 4 graphs for 4 values)."""

    def head(x: torch.Tensor, n: int) -> torch.Tensor:
        return x[:, :n] * 2 + n

    backend = chain("onnxruntime", "eager", measure=False)
    torch._dynamo.reset()
    compiled = torch.compile(head, backend=backend, dynamic=True)
    x = torch.randn(3, 10)
    with torch.no_grad():
        for n in (3, 5, 8, 6):
            torch.testing.assert_close(compiled(x, n), head(x, n))
    (graph,) = backend.report.graphs
    assert graph.winner == "onnxruntime"
    assert graph.winning_attempt.details["intra_op_threads"] in (1, "default")


@pytest.mark.parametrize("timed", [1, 0], ids=["one-thread", "default"])
def test_a_stored_export_keeps_its_count_and_is_not_timed_again(
    monkeypatch: pytest.MonkeyPatch, timed: int
) -> None:
    """The count timed at the first compile goes into the export's artefact; a warm start
    (`onnxruntime_reuse`, as the decision store does on the same machine) builds its session
    with that count and times nothing. A header with another value is refused."""
    import backends.onnxruntime as ort
    from backends.onnxruntime.artefact import from_artefact

    model, _ = build_extra("bert")
    graphs: list[tuple[torch.fx.GraphModule, list[Any]]] = []
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (0.0, 0.0, 0.0))  # stored if decided

    def capture(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    x = torch.randint(0, 100, (2, 7))
    with torch.no_grad():
        want = torch.compile(model, backend=capture)(x).last_hidden_state
        ((gm, inputs),) = graphs
        runner = ort.onnxruntime_backend(gm, inputs)
        chose = runner.chain_details["intra_op_threads"]  # timed at this compile
        assert runner.graph.threads == 1 if chose == 1 else runner.graph.threads in (0, None)
        stored = dataclasses.replace(runner.graph, threads=timed)
        data = to_artefact(stored).data
        assert from_artefact(data).threads == timed

        def no_timing(*args: Any) -> Any:
            raise AssertionError("timed again")

        monkeypatch.setattr(ort, "choose_threads", no_timing)
        again = ort.onnxruntime_reuse(gm, inputs, artefact=data)
        assert again.chain_details["intra_op_threads"] == (timed or "default")
        assert "as timed when this export was stored" in again.chain_details["intra_op_threads_why"]
        assert again.session.get_session_options().intra_op_num_threads == timed
        torch.testing.assert_close(again(*inputs)[0], want)
    bad = data.replace(f'"intra_op_threads": {timed}'.encode(), b'"intra_op_threads": 7', 1)
    with pytest.raises(Unsupported, match="intra_op_threads"):
        from_artefact(bad)
