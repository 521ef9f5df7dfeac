"""The per-call path of a launch-bound winner (issue 38): the fast path's aliasing and reuse
checks read each storage once a call, and still catch what the general path catches, with
its words, on a graph of several inputs and outputs, at calls that no re-verification is
scheduled for (the first ones are 2, 4 and 8)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import fx

from chain import Status, chain
from chain.report.records import GraphRecord
from chain.run.watch import InputsWritten


class WrongFrom:
    """Right until the guard's call `start`, then `spoil`s its outputs (its run call 1 is
    selection's verification: measure=False)."""

    def __init__(
        self, spoil: Callable[[tuple[Any, ...], list[Any]], list[Any]], start: int
    ) -> None:
        self.spoil, self.start = spoil, start
        self.__name__ = "wrong_from"

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        calls = 0

        def run(*args: Any) -> Any:
            nonlocal calls
            calls += 1
            out = list(gm(*args))
            return self.spoil(args, out) if calls > self.start else out

        return run


def three(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, n: torch.Tensor) -> Any:
    """Three fresh float outputs of three float inputs; `n` (int) is never aliased."""
    return a + 1, b * 2, c[1:] - 1, n + 1


def _inputs() -> tuple[torch.Tensor, ...]:
    return torch.randn(4, 8), torch.randn(4, 8), torch.randn(5, 8), torch.arange(3)


def _demoted(graph: GraphRecord) -> str | None:
    first = graph.attempts[0]
    assert first.status is Status.MISMATCH, first
    return first.reason


def _run(backend: Any, calls: int = 6) -> list[Any]:
    compiled = torch.compile(three, backend=backend)
    held = []
    with torch.no_grad():
        for _ in range(calls):
            args = _inputs()
            out = compiled(*args)
            for got, want in zip(out, three(*args), strict=True):
                torch.testing.assert_close(got, want)
            held.append(out)  # the caller keeps every answer
    return held


def _view_of_input_c(args: tuple[Any, ...], out: list[Any]) -> list[Any]:
    return [*out[:2], args[2][1:], out[3]]  # the caller's own `c`, at an offset


def _input_b(args: tuple[Any, ...], out: list[Any]) -> list[Any]:
    return [args[1], *out[1:]]  # the caller's own `b` (the wrong values too: it is caught)


@pytest.mark.parametrize(
    "spoil, reason",
    [
        (_view_of_input_c, "output 2 aliases input 2; eager's is fresh memory"),
        (_input_b, "output 0 aliases input 1; eager's is fresh memory"),
    ],
)
def test_an_output_in_any_inputs_memory_is_caught_at_an_unscheduled_call(
    spoil: Callable[..., list[Any]], reason: str, guard_path: str
) -> None:
    backend = chain(WrongFrom(spoil, 3), "eager", measure=False)
    _run(backend)
    graph = backend.report.graphs[0]
    assert _demoted(graph) == f"at call 3: {reason}"
    assert graph.winner == "eager"


def test_an_empty_input_aliases_nothing(guard_path: str) -> None:
    """Empty tensors share the null pointer: an empty output is never taken for an alias."""

    def empties(a: torch.Tensor, b: torch.Tensor) -> Any:
        return a * 2, b + 1

    backend = chain(lambda gm, ex: gm.forward, "eager", measure=False)
    compiled = torch.compile(empties, backend=backend)
    with torch.no_grad():
        for _ in range(6):
            a, b = torch.randn(3, 0), torch.randn(4)
            out = compiled(a, b)
            assert out[0].shape == (3, 0) and torch.equal(out[1], b + 1)
    graph = backend.report.graphs[0]
    assert graph.winner is not None and graph.winner != "eager"
    assert all(a.status is not Status.MISMATCH for a in graph.attempts)


def test_one_buffer_for_a_later_output_is_caught_at_an_unscheduled_call(guard_path: str) -> None:
    kept: list[torch.Tensor] = []

    def one_buffer_for_output_1(args: tuple[Any, ...], out: list[Any]) -> list[Any]:
        if not kept:
            kept.append(out[1].clone())
        kept[0].copy_(out[1])
        return [out[0], kept[0], *out[2:]]  # the same tensor every call from call 4 on

    backend = chain(WrongFrom(one_buffer_for_output_1, 4), "eager", measure=False)
    held = _run(backend)
    graph = backend.report.graphs[0]
    assert _demoted(graph) == (
        "at call 5: output 1 is the memory of output 1 of an earlier call, "
        "which the caller still holds: that answer was overwritten"
    )
    assert graph.winner == "eager"
    assert sum(h[1] is kept[0] for h in held) == 1  # only call 4's answer is the buffer


def test_two_outputs_at_one_pointer_are_both_remembered(guard_path: str) -> None:
    """An output and a view of it share a pointer: the caller holding the first (not the
    view) is enough for a later call handing that memory out again to be caught."""

    def pair(x: torch.Tensor) -> Any:
        y = x * 2
        return y, y.view(-1)

    def static_pair(args: tuple[Any, ...], out: list[Any]) -> list[Any]:
        if not buffer:
            buffer.append(out[0].clone())
        buffer[0].copy_(out[0])
        return [buffer[0], buffer[0].view(-1)]

    buffer: list[torch.Tensor] = []
    backend = chain(WrongFrom(static_pair, 4), "eager", measure=False)
    compiled = torch.compile(pair, backend=backend)
    kept = []
    with torch.no_grad():
        for _ in range(6):
            y, flat = compiled(torch.randn(2, 3))
            kept.append(y)  # the caller keeps the first output only
            del flat
    graph = backend.report.graphs[0]
    assert _demoted(graph) == (
        "at call 5: output 0 is the memory of output 0 of an earlier call, "
        "which the caller still holds: that answer was overwritten"
    )
    assert graph.winner == "eager"


def test_a_write_to_an_activation_at_an_unscheduled_call_stops_that_call(guard_path: str) -> None:
    def writes_b(args: tuple[Any, ...], out: list[Any]) -> list[Any]:
        args[1].add_(1.0)  # eager leaves `b` alone; its version counter moves
        return out

    backend = chain(WrongFrom(writes_b, 3), "eager", measure=False)
    compiled = torch.compile(three, backend=backend)
    with torch.no_grad():
        for _ in range(2):
            compiled(*_inputs())
        args = _inputs()
        with pytest.raises(InputsWritten, match=r"wrote input\(s\) \[1\] where eager does not"):
            compiled(*args)
        out = compiled(*args)  # eager from now on
    graph = backend.report.graphs[0]
    assert _demoted(graph) == "at call 3: wrote input(s) [1] where eager does not"
    assert graph.winner == "eager" and torch.equal(out[1], args[1] * 2)


class Scaled(torch.nn.Module):
    """One activation and a buffer: the buffer is a weight for the run-time checks."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("shift", torch.randn(4, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 + self.shift


def test_an_output_in_a_buffers_memory_is_caught_by_the_next_reverification(
    guard_path: str,
) -> None:
    """Per call, fresh outputs are checked against the activations; against the buffers at
    each re-verification, as against the parameters (the general path checks both)."""
    model = Scaled().eval()
    position: list[int] = []

    def the_buffer(args: tuple[Any, ...], out: list[Any]) -> list[Any]:
        position[:] = [next(i for i, a in enumerate(args) if a is model.shift)]
        return [args[position[0]]]

    backend = chain(WrongFrom(the_buffer, 3), "eager", measure=False)
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for _ in range(5):
            compiled(torch.randn(4, 8))
    graph = backend.report.graphs[0]
    call = 3 if guard_path == "general" else 4  # 4: the scheduled re-verification
    reason = f"output 0 aliases input {position[0]}; eager's is fresh memory"
    assert _demoted(graph) == f"at call {call}: {reason}"
    assert graph.winner == "eager"


def test_onnxruntime_cpu_call_answers_from_each_reexport() -> None:
    """The runner's CPU call is a closure over one session: after each refresh the new
    session's answers, that call and the next ones, and a second change re-exports again."""
    pytest.importorskip("onnxruntime")
    from backends.registry import lookup_backend

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 4))
    runners: list[Any] = []

    def ours(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        runners.append(lookup_backend("onnxruntime")(gm, example_inputs))
        return runners[-1]

    compiled = torch.compile(model.eval(), backend=ours)
    with torch.no_grad():
        for change in range(3):
            if change:
                model[0].weight.mul_(2.0)
            for _ in range(2):
                x = torch.randn(1, 8)
                torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    assert len(runners) == 1 and runners[0].refreshes == 2


def test_inference_tensors_are_served_without_version_counters(guard_path: str) -> None:
    """Under inference_mode the activations keep no counter: their reads fall back to the
    general path's (NO_VERSION) and calls are served, right, by the winner."""
    backend = chain(lambda gm, ex: gm.forward, "eager", measure=False)
    compiled = torch.compile(three, backend=backend)
    with torch.inference_mode():
        for _ in range(10):
            args = _inputs()
            for got, want in zip(compiled(*args), three(*args), strict=True):
                torch.testing.assert_close(got, want)
    graph = backend.report.graphs[0]
    assert graph.winner != "eager" and graph.watch is not None and graph.watch.failures == []
    assert graph.watch.calls == 10
