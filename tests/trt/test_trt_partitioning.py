"""Decomposition and partitioning on the test models: which ops go where, and why."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from torch import fx

from backends.common.fx_utils import op_counts
from backends.errors import Unsupported
from backends.tensorrt.aten import to_aten
from backends.tensorrt.partitioning import SUPPORT_TABLE, PartitionOptions, check, partition
from backends.tensorrt.pipeline import plan
from tests.trt.helpers import aten, aten_graph, dynamo_graph

graph = functools.cache(dynamo_graph)


@pytest.mark.parametrize(
    ("name", "kept_whole"),
    [
        ("cnn", {"aten.conv2d.default", "aten._native_batch_norm_legit_no_training.default"}),
        ("transformer", {"aten.linear.default", "aten.layer_norm.default", "aten.gelu.default"}),
        ("mlp", {"aten.linear.default", "aten.gelu.default"}),
    ],
)
def test_decomposition_keeps_tensorrt_friendly_ops_whole(name: str, kept_whole: set[str]) -> None:
    gm, inputs, expected = graph(name)
    before = gm.code
    traced = to_aten(gm, inputs)
    ops = op_counts(traced.gm)
    assert kept_whole <= set(ops)
    assert not any(op.startswith(("aten.addmm", "aten.t.", "aten.var_mean")) for op in ops)
    assert "aten._transformer_encoder_layer_fwd.default" not in ops  # written out
    assert gm.code == before  # the dynamo graph is never mutated
    torch.testing.assert_close(traced.gm(*inputs)[0], expected)


@pytest.mark.parametrize(("name", "ops_total"), [("cnn", 9), ("transformer", 27), ("mlp", 3)])
def test_models_go_to_tensorrt_whole(name: str, ops_total: int) -> None:
    gm, inputs, expected = graph(name)
    the_plan = plan(gm, inputs, PartitionOptions())
    details = the_plan.result.details("tensorrt")
    whole = {"ops_total": ops_total, "ops_tensorrt": ops_total, "engines": 1, "fallback": {}}
    assert details == whole
    assert len(the_plan.engine_inputs) == 1
    torch.testing.assert_close(the_plan.gm(*inputs)[0], expected)


def test_weights_are_constants_of_the_block() -> None:
    gm, inputs, _ = graph("cnn")
    the_plan = plan(gm, inputs, PartitionOptions())
    (name,) = the_plan.result.blocks
    block = the_plan.block(name)
    placeholders = [n for n in block.graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == 1  # the image; weights and BN statistics are buffers
    assert tuple(the_plan.engine_inputs[name][0].shape) == (2, 3, 16, 16)
    assert len(list(block.buffers())) == 14


def test_unsupported_op_and_small_blocks_fall_back_with_reasons() -> None:
    gm, inputs, expected = graph("two_outputs")
    the_plan = plan(gm, inputs, PartitionOptions())
    result = the_plan.result
    assert result.blocks == [] and result.ops_compiled == 0
    assert result.fallback == {
        "aten.linalg_vector_norm.default": {"no TensorRT converter": 1},
        "aten.linear.default": {"block too small (2 < min_block_size=5)": 1},
        "aten.tanh.default": {"block too small (2 < min_block_size=5)": 1},
        "aten.div.Tensor": {"block too small (1 < min_block_size=5)": 1},
    }
    with_small = plan(gm, inputs, PartitionOptions(min_block_size=1)).result
    assert with_small.ops_compiled == 3 and len(with_small.blocks) == 2
    assert with_small.fallback == {"aten.linalg_vector_norm.default": {"no TensorRT converter": 1}}
    for got, want in zip(plan(gm, inputs, PartitionOptions(1)).gm(*inputs), expected, strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("spelling", ["aten.gelu", "aten.gelu.default", "torch.ops.aten.gelu"])
def test_torch_executed_ops_split_the_transformer(spelling: str) -> None:
    gm, inputs, expected = graph("transformer")
    options = PartitionOptions(min_block_size=1, torch_executed_ops=frozenset({spelling}))
    the_plan = plan(gm, inputs, options)
    result = the_plan.result
    assert result.fallback == {"aten.gelu.default": {"excluded by torch_executed_ops": 1}}
    assert result.ops_compiled == 26 and len(result.blocks) == 2
    call = next(n for n in the_plan.gm.graph.nodes if n.target == aten.gelu.default)
    assert call.op == "call_function"  # gelu sits in the PyTorch part, between two blocks
    torch.testing.assert_close(the_plan.gm(*inputs)[0], expected)


def test_min_block_size_drops_blocks_but_never_the_whole_graph() -> None:
    gm, inputs, _ = graph("transformer")
    excluded = frozenset({"aten.gelu"})
    small = plan(gm, inputs, PartitionOptions(min_block_size=5, torch_executed_ops=excluded))
    large = plan(gm, inputs, PartitionOptions(min_block_size=30, torch_executed_ops=excluded))
    assert len(small.result.blocks) == 1  # the 4 ops after gelu are too few
    assert small.result.fallback["aten.layer_norm.default"] == {
        "block too small (4 < min_block_size=5)": 2
    }
    assert large.result.blocks == [] and large.result.ops_compiled == 0
    mlp_gm, mlp_inputs, _ = graph("mlp")  # 3 ops < 5, but they are the whole graph
    assert plan(mlp_gm, mlp_inputs, PartitionOptions(min_block_size=5)).result.blocks


def test_require_full_compilation_raises_with_reasons() -> None:
    gm, inputs, _ = graph("two_outputs")
    with pytest.raises(Unsupported, match=r"linalg_vector_norm\.default: no TensorRT converter"):
        plan(gm, inputs, PartitionOptions(min_block_size=1, require_full_compilation=True))
    cnn_gm, cnn_inputs, _ = graph("cnn")
    assert plan(cnn_gm, cnn_inputs, PartitionOptions(require_full_compilation=True)).result


def _node(fn: Any, *inputs: torch.Tensor, target: Any) -> fx.Node:
    gm = aten_graph(fn, *inputs)
    return next(n for n in gm.graph.nodes if n.target == target)


def test_support_rules_dtype_shape_and_validators() -> None:
    x = torch.randn(2, 3)
    assert check(_node(torch.relu, x, target=aten.relu.default)) is None
    assert check(_node(torch.relu, x.double(), target=aten.relu.default)) == (
        "dtype float64 not supported by aten.relu"
    )
    assert check(_node(torch.nonzero, x, target=aten.nonzero.default)) == "data-dependent shape"
    assert check(_node(torch.fft.fft, x, target=aten._fft_r2c.default)) == "no TensorRT converter"
    big = torch.randn(*[1] * 9)
    assert check(_node(torch.relu, big, target=aten.relu.default)) == "rank 9 > 8"
    w = torch.randn(3, 2, 3, 3)

    def deconv(a: torch.Tensor) -> torch.Tensor:
        return torch.conv_transpose2d(a, w, stride=2, output_padding=1)

    node = _node(deconv, torch.randn(1, 3, 5, 5), target=aten.convolution.default)
    assert check(node) == "transposed convolution with output_padding"


def test_support_table_is_data() -> None:
    assert len(SUPPORT_TABLE) >= 100
    row = SUPPORT_TABLE[aten.embedding]
    assert row.name == "aten.embedding" and torch.int64 in row.dtypes
    with pytest.raises(AttributeError):
        row.dtypes = frozenset()  # type: ignore[misc]


def test_partition_without_supported_ops_leaves_graph_alone() -> None:
    x = torch.randn(4)
    gm = aten_graph(lambda a: torch.fft.fft(a).abs(), x)
    split, result = partition(gm, PartitionOptions(min_block_size=1))
    assert result.blocks == [] and result.ops_total == 2
    assert "aten._fft_r2c.default" in result.fallback
    torch.testing.assert_close(split(x), torch.fft.fft(x).abs())
