"""The onnxruntime backend never runs wrong: frozen weights, in-place writes, dynamic shapes."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import onnx
import pytest
import torch
from torch import nn

from backends import Unsupported, lookup_backend
from backends.common.onnx_export import check_dynamic, export_onnx
from backends.onnxruntime import OrtRunner

BACKEND = lookup_backend("onnxruntime")


def capturing(runners: list[OrtRunner], inputs: list[list[Any]]) -> Callable[..., Any]:
    """A dynamo backend compiling with onnxruntime that keeps each runner and its inputs."""

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        runner = BACKEND(gm, example_inputs)
        runners.append(runner)
        inputs.append(list(example_inputs))
        return runner

    return backend


def tiny_bert() -> nn.Module:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64,
    )  # fmt: skip
    return BertModel(config).eval()


def test_clone_of_a_frozen_buffer_is_not_a_weight_change(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The chain runs candidates on clones of buffers (BERT's position ids): equal values,
    another tensor. That is no reason to re-export (it re-exported on every call)."""
    pytest.importorskip("transformers")
    model, ids = tiny_bert(), torch.randint(0, 100, (2, 8))
    runners: list[OrtRunner] = []
    inputs: list[list[Any]] = []
    with torch.inference_mode():
        torch.compile(model, backend=capturing(runners, inputs))(ids)
        (runner,), (args,) = runners, inputs
        frozen = runner.chain_details["frozen_inputs"]
        buffers = [i for i in frozen if not isinstance(args[i], nn.Parameter)]
        assert buffers, "BertModel's position/token type ids are frozen buffers"
        clones = [a.clone() if i in buffers else a for i, a in enumerate(args)]
        with caplog.at_level(logging.WARNING):
            out = runner(*clones)
        expected = model(ids).last_hidden_state
    torch.testing.assert_close(out[0], expected, rtol=1e-4, atol=1e-4)
    assert runner.reexports == 0 and runner.chain_details["reexports"] == 0
    assert "re-exporting" not in caplog.text


def test_a_different_buffer_is_a_weight_change() -> None:
    """The other side: a tensor with other values in a frozen position is re-exported."""
    model = nn.Linear(4, 2).eval()
    x = torch.randn(3, 4)
    runners: list[OrtRunner] = []
    inputs: list[list[Any]] = []
    with torch.no_grad():
        torch.compile(model, backend=capturing(runners, inputs))(x)
        (runner,), (args,) = runners, inputs
        weight = next(i for i, a in enumerate(args) if a is model.weight)
        changed = [a * 2 if i == weight else a for i, a in enumerate(args)]
        out = runner(*changed)
    torch.testing.assert_close(out[0], torch.nn.functional.linear(x, model.weight * 2, model.bias))
    assert runner.refreshes == 1 and runner.chain_details["refreshes"] == 1


def double_in_place(x: torch.Tensor) -> torch.Tensor:
    x.mul_(2)
    return x + 1


class Counter(nn.Module):
    """Writes to a module buffer in place on every call (a buffer cannot be an initializer)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return self.lin(x) * self.calls


def test_write_to_an_input_is_applied_to_the_callers_tensor() -> None:
    x = torch.randn(5)
    expected_x, expected_out = x * 2, x * 2 + 1
    runners: list[OrtRunner] = []
    with torch.no_grad():
        out = torch.compile(double_in_place, backend=capturing(runners, []))(x)
    torch.testing.assert_close(x, expected_x)
    torch.testing.assert_close(out, expected_out)
    (runner,) = runners
    assert runner.chain_details["mutated_inputs"] == [0]


def test_write_to_a_module_buffer_is_applied_and_not_frozen() -> None:
    model, reference = Counter().eval(), Counter().eval()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(3, 4)
    runners: list[OrtRunner] = []
    compiled = torch.compile(model, backend=capturing(runners, []))
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(compiled(x), reference(x))
    assert model.calls.item() == reference.calls.item() == 3
    (runner,) = runners
    assert len(runner.chain_details["mutated_inputs"]) == 1
    assert runner.reexports == 0


def test_in_place_graph_wins_in_a_chain_with_eager_state() -> None:
    from chain import chain

    backend = chain("onnxruntime", "eager", measure=False)
    x = torch.randn(6)
    expected_x, expected_out = x * 2, x * 2 + 1
    with torch.no_grad():
        out = torch.compile(double_in_place, backend=backend)(x)
    torch.testing.assert_close(x, expected_x)
    torch.testing.assert_close(out, expected_out)
    (graph,) = backend.report.graphs
    assert graph.winner == "onnxruntime"


def test_transformers_model_at_three_sequence_lengths() -> None:
    """Dynamo marks the sequence dim dynamic at the second length: one dynamic graph,
    exported with that dim symbolic, runs the third length without a new compile."""
    pytest.importorskip("transformers")
    model = tiny_bert()
    runners: list[OrtRunner] = []
    compiled = torch.compile(model, backend=capturing(runners, []))
    with torch.inference_mode():
        for seq in (8, 12, 16):
            ids = torch.randint(0, 100, (2, seq))
            torch.testing.assert_close(
                compiled(ids).last_hidden_state,
                model(ids).last_hidden_state,
                rtol=1e-4,
                atol=1e-4,
            )
    assert len(runners) == 2
    static, dynamic = (r.chain_details["dynamic_dims"] for r in runners)
    assert static == {} and list(dynamic.values()) == [[1]]
    assert all(r.reexports == 0 for r in runners)


def test_a_dim_the_exporter_cannot_keep_dynamic_is_declined_as_dynamic_shapes() -> None:
    gm = torch.fx.symbolic_trace(lambda x: x + torch.ones(4, 3))
    with pytest.raises(Unsupported, match=r"^dynamic shapes: .*(conflicts|Constraints violated)"):
        export_onnx(gm, [torch.randn(4, 3)], dynamic_dims={0: (0,)}, freeze=())


def test_a_model_with_a_fixed_dim_where_a_symbolic_one_was_asked_is_declined() -> None:
    """The exporter may specialize a dim quietly: the model's input then has a number."""
    gm = torch.fx.symbolic_trace(lambda x: x * 2)
    x = torch.randn(4, 3)
    static = export_onnx(gm, [x], dynamic_dims={}, freeze=())
    proto = onnx.load_from_string(static.model)
    check_dynamic(proto, static.input_positions, {})  # nothing asked: nothing to decline
    with pytest.raises(Unsupported, match=r"^dynamic shapes: .*dim 1 of input 0 to 3"):
        check_dynamic(proto, static.input_positions, {0: (1,)})
