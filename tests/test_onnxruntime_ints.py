"""Symbolic int inputs no tensor size carries (a length, a cache position) under dynamic=True:
ONNX Runtime takes them as size carriers of their own, fed at every call (issue 47)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from backends import Unsupported, lookup_backend
from backends.common.onnx_export import export_onnx
from backends.onnxruntime import OrtRunner, onnxruntime_reuse
from chain import chain

BACKEND = lookup_backend("onnxruntime")
MODES: dict[str, Callable[[], Any]] = {
    "inference_mode": torch.inference_mode,
    "no_grad": torch.no_grad,
}


def head_and_count(x: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Reads an int that is no tensor's size: a slice length, an offset, an arange."""
    return x[:, :n] * 2 + n, torch.arange(n, dtype=torch.float32).sum() + x.sum()


def captured(
    fn: Callable[..., Any], *args: Any, **kwargs: Any
) -> list[tuple[torch.fx.GraphModule, list[Any]]]:
    """The graphs dynamo hands a backend for `fn(*args, **kwargs)` under dynamic=True."""
    graphs: list[tuple[torch.fx.GraphModule, list[Any]]] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=backend, dynamic=True)(*args, **kwargs)
    return graphs


@pytest.mark.parametrize("mode", list(MODES))
def test_an_int_input_is_fed_as_a_size_carrier(mode: str) -> None:
    """One graph for every n, won by onnxruntime, each answer eager's."""
    backend = chain("onnxruntime", "eager", measure=False)
    torch._dynamo.reset()
    compiled = torch.compile(head_and_count, backend=backend, dynamic=True)
    x, others = torch.randn(3, 10), [torch.randn(batch, 12) for batch in (2, 4)]
    with MODES[mode]():
        for n in (3, 5, 8):
            torch.testing.assert_close(compiled(x, n), head_and_count(x, n))
        for y in others:  # the tensor's sizes move too
            torch.testing.assert_close(compiled(y, 7), head_and_count(y, 7))
    (graph,) = backend.report.graphs
    assert graph.winner == "onnxruntime", (graph.attempts, graph.notes)  # why, if it lost
    details = graph.attempts[0].details
    assert len(details["size_carriers"]) == 1
    assert details["size_carriers"][0] not in details["derived_symints"]


def test_size_carriers_answer_from_threads() -> None:
    """The runner feeds each call's own int: four threads with different n at once."""
    ((gm, inputs),) = captured(head_and_count, torch.randn(3, 10), 4)
    runner = BACKEND(gm, inputs)
    x = torch.randn(3, 10)
    position = runner.graph.carriers[0]
    errors: list[BaseException] = []

    def calls(n: int) -> None:
        try:
            for _ in range(20):
                got = runner(*_args_like(inputs, x, n, position))
                torch.testing.assert_close(list(got), list(head_and_count(x, n)))
        except BaseException as error:  # reported on the test's thread
            errors.append(error)

    threads = [threading.Thread(target=calls, args=(n,)) for n in (2, 3, 6, 9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def _args_like(inputs: list[Any], x: torch.Tensor, n: int, position: int) -> list[Any]:
    """The graph's inputs for `x` and `n`: the tensor where the example had one, `n` at the
    carrier's position, the tensor's sizes at the other int positions (its symbolic dims)."""
    sizes = iter(x.shape)
    return [
        x if isinstance(v, torch.Tensor) else n if i == position else next(sizes)
        for i, v in enumerate(inputs)
    ]


def test_the_artefact_keeps_its_carriers() -> None:
    """A store's artefact rebuilds a runner that feeds the carrier (no export again)."""
    ((gm, inputs),) = captured(head_and_count, torch.randn(3, 10), 4)
    runner = BACKEND(gm, inputs)
    again = onnxruntime_reuse(gm, inputs, artefact=runner.chain_artefact.data)
    assert isinstance(again, OrtRunner) and again.chain_details["from_artefact"]
    assert again.graph.carriers == runner.graph.carriers
    x = torch.randn(3, 10)
    got = again(*_args_like(inputs, x, 6, runner.graph.carriers[0]))
    torch.testing.assert_close(list(got), list(head_and_count(x, 6)))


def test_without_carriers_the_reason_names_the_input() -> None:
    """An exporter that reads sizes from tensor shapes only (TensorRT's blocks, ORT parts)
    refuses, naming the placeholder and where dynamo took it from, not its value."""
    refusals: list[Unsupported] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        try:  # while dynamo compiles: its placeholders still say where each input comes from
            export_onnx(gm, example_inputs)
        except Unsupported as error:
            refusals.append(error)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(head_and_count, backend=backend, dynamic=True)(torch.randn(3, 10), 4)
    (refusal,) = refusals
    assert "l_n_ (L['n'])" in refusal.reason
    assert "onnxruntime" in refusal.reason and "mark_static" in refusal.reason
    assert "int input 4 " not in refusal.reason


def last(x: torch.Tensor, **kwargs: int) -> torch.Tensor:
    """Keeps the last `keep` positions, as transformers' `logits_to_keep` does."""
    return x[:, -kwargs["keep"] :, :] * 3


def test_a_specialized_int_is_inlined() -> None:
    """An int dynamo specialized (its symbol replaced by the number, which dynamo guards
    on: transformers' `logits_to_keep=1` under dynamic=True) is a constant, not an input."""
    ((gm, inputs),) = captured(last, torch.randn(2, 5, 4), keep=1)
    symbolic = [i for i, v in enumerate(inputs) if isinstance(v, torch.SymInt)]
    names = [n.name for n in gm.graph.find_nodes(op="placeholder")]
    symbolic_keep = [i for i in symbolic if "keep" in names[i]]
    assert len(symbolic_keep) == 1
    graph = export_onnx(gm, inputs, carry_ints=True)
    assert graph.carriers == () and symbolic_keep[0] in graph.derived
    runner = BACKEND(gm, inputs)
    for length in (5, 9):
        x = torch.randn(2, length, 4)
        sizes = iter(x.shape)
        args = [
            x if isinstance(v, torch.Tensor) else 1 if i in symbolic_keep else next(sizes)
            for i, v in enumerate(inputs)
        ]
        (got,) = runner(*args)
        torch.testing.assert_close(got, last(x, keep=1))
