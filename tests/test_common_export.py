"""Shared export machinery in backends/common: partitioner, payload format, parts, ORT session."""

from __future__ import annotations

import operator
import struct
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from torch import fx

from backends.common.ort_session import element_type, session_options
from backends.common.partitioner import (
    EXCLUDED,
    PartitionOptions,
    ReasonedSupport,
    block_calls,
    partition,
    summarize,
)
from backends.common.parts import WHOLE, Part, as_single_call, flat_outputs
from backends.common.payload import (
    MAGIC,
    Header,
    PayloadError,
    TensorSpec,
    digest,
    pack,
    specs_from_str,
    specs_to_str,
    unpack,
    verify_body,
    version_tuple,
)
from backends.errors import Unsupported


def _graph() -> tuple[fx.GraphModule, torch.Tensor]:
    """relu -> sin -> relu -> add -> neg: sin is the op our toy predicate refuses."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    a = graph.call_function(torch.ops.aten.relu.default, (x,))
    b = graph.call_function(torch.ops.aten.sin.default, (a,))
    c = graph.call_function(torch.ops.aten.relu.default, (b,))
    d = graph.call_function(torch.ops.aten.add.Tensor, (c, x))
    e = graph.call_function(torch.ops.aten.neg.default, (d,))
    graph.output((e,))
    return fx.GraphModule(torch.nn.Module(), graph), torch.randn(4)


def _no_sin(excluded: frozenset[str] = frozenset()) -> ReasonedSupport:
    from backends.common.partitioner import is_excluded

    def reason(node: fx.Node) -> str | None:
        if is_excluded(node, excluded):
            return EXCLUDED
        return "no sine here" if node.target is torch.ops.aten.sin.default else None

    return ReasonedSupport(reason)


def test_partitioner_splits_around_refused_ops_with_reasons() -> None:
    gm, x = _graph()
    expected = gm(x)
    split, result = partition(gm, PartitionOptions(min_block_size=1), _no_sin())
    assert result.ops_total == 5 and result.ops_compiled == 4 and len(result.blocks) == 2
    assert result.fallback == {"aten.sin.default": {"no sine here": 1}}
    assert [str(n.target) for n in block_calls(split)] == result.blocks
    details = result.details("toy")
    assert details["ops_toy"] == 4 and details["engines"] == 2
    torch.testing.assert_close(split(x), expected)


def test_partitioner_min_block_size_and_exclusions() -> None:
    gm, _ = _graph()
    _, result = partition(gm, PartitionOptions(min_block_size=4), _no_sin())
    assert result.blocks == [] and result.ops_compiled == 0
    assert result.fallback["aten.relu.default"] == {
        "block too small (1 < min_block_size=4)": 1,
        "block too small (3 < min_block_size=4)": 1,
    }
    assert result.fallback["aten.neg.default"] == {"block too small (3 < min_block_size=4)": 1}
    gm, _ = _graph()
    options = PartitionOptions(min_block_size=1, torch_executed_ops=frozenset({"aten.neg"}))
    _, result = partition(gm, options, _no_sin(options.torch_executed_ops))
    assert result.fallback["aten.neg.default"] == {EXCLUDED: 1}
    assert "aten.neg.default: excluded" in summarize(result.fallback)


def test_partition_result_leaves_a_block_to_pytorch() -> None:
    gm, _ = _graph()
    _, result = partition(gm, PartitionOptions(min_block_size=1), _no_sin())
    first = result.blocks[0]
    result.leave_to_pytorch(first, {"aten.relu.default": 1}, "parser refused")
    assert first not in result.blocks and result.ops_compiled == 3
    assert result.fallback["aten.relu.default"] == {"parser refused": 1}


def test_require_full_compilation_refuses_partial_graphs() -> None:
    gm, _ = _graph()
    options = PartitionOptions(min_block_size=1, require_full_compilation=True)
    with pytest.raises(Unsupported, match="1 op\\(s\\) would run in PyTorch"):
        partition(gm, options, _no_sin())


def _header(body: bytes) -> Header:
    specs = (TensorSpec((2, 3), "float16"), TensorSpec((), "int64"))
    return Header("toy", "1.2.3", digest(body), ("a",), ("b", "c"), specs, opset=18)


def test_payload_round_trips_and_refuses_damage() -> None:
    body = b"model bytes"
    header = _header(body)
    data = pack(header, body)
    got, view = unpack(data)
    assert got == header and bytes(view) == body
    assert header.describe() == "toy 1.2.3 (opset 18)"
    verify_body(got, view)
    with pytest.raises(PayloadError, match="corrupted"):
        verify_body(got, memoryview(b"model bytez"))
    with pytest.raises(PayloadError, match="truncated"):
        unpack(data[: len(MAGIC) + 10])
    with pytest.raises(PayloadError, match="bad magic"):
        unpack(b"NOTOURS!" + data[8:])
    nameless = b'{"version": "1"}'
    with pytest.raises(PayloadError, match="names no backend"):
        unpack(MAGIC + struct.pack("<I", len(nameless)) + nameless)


def test_tensor_spec_is_one_class_for_outputs_and_cache_keys() -> None:
    spec = TensorSpec.of(torch.zeros(2, 3, dtype=torch.bfloat16))
    assert spec == TensorSpec((2, 3), "bfloat16") and spec.torch_dtype is torch.bfloat16
    assert specs_from_str(specs_to_str([spec])) == [spec]
    with pytest.raises(PayloadError, match="unknown output dtype 'float7'"):
        _ = TensorSpec((1,), "float7").torch_dtype
    assert version_tuple("1.22.0+cu130") == (1, 22, 0)


def test_parts_whole_graph_call_and_summary() -> None:
    gm, x = _graph()
    single = as_single_call(gm)
    calls = [n for n in single.graph.nodes if n.op == "call_module"]
    assert [str(n.target) for n in calls] == [WHOLE]
    assert all(u.target is operator.getitem for u in calls[0].users)
    torch.testing.assert_close(single(x), gm(x))
    assert flat_outputs(x) == ([x], False) and flat_outputs((x, x)) == ([x, x], True)
    part = Part(WHOLE, _header(b"m"), b"m", (1,), True, ops=5, example_inputs=("s", x))
    assert part.inputs == [x]
    assert unpack(part.payload)[0] == part.header
    assert part.summary()["built_by"] == "toy 1.2.3 (opset 18)"


def test_ort_session_pieces() -> None:
    pytest.importorskip("onnxruntime")
    import onnxruntime as ort

    options = session_options("basic", 2)
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert options.intra_op_num_threads == 2
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    with pytest.raises(ValueError, match="valid: disable, basic, extended, all"):
        session_options("most")
    from onnx import TensorProto

    assert element_type(torch.bfloat16) == TensorProto.BFLOAT16
    with pytest.raises(Unsupported, match="no ONNX element type"):
        element_type(torch.qint8)


def _by_grad_mode(x: torch.Tensor) -> torch.Tensor:
    """Traced differently with gradients on (as attention kernels pick their layout)."""
    return x * 2 if torch.is_grad_enabled() else x + 1


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "enable_grad"])
def test_onnx_export_traces_in_the_callers_grad_mode(mode: str) -> None:
    """Regression (Swin, T5 encoder): the exporter's clean thread traced with gradients on
    (a new thread's default) a graph captured under no_grad."""
    import onnxruntime

    from backends.common.onnx_export import export_onnx

    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output((graph.call_function(_by_grad_mode, (x,)),))
    gm = fx.GraphModule(torch.nn.Module(), graph)
    inputs = [torch.randn(3), torch.randn(2, 5)]
    context = {
        "no_grad": torch.no_grad,
        "inference_mode": torch.inference_mode,
        "enable_grad": torch.enable_grad,
    }[mode]

    def export(example: torch.Tensor) -> bytes:
        with context():
            return export_onnx(gm, [example], freeze=(), dynamic_dims={}).model

    with ThreadPoolExecutor(max_workers=2) as pool:  # also from the caller's own threads
        models = list(pool.map(export, inputs))
    for model, example in zip(models, inputs, strict=True):
        session = onnxruntime.InferenceSession(model)
        [out] = session.run(None, {session.get_inputs()[0].name: example.numpy()})
        expected = example * 2 if mode == "enable_grad" else example + 1
        torch.testing.assert_close(torch.from_numpy(out), expected)
