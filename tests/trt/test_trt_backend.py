"""The registered backend: availability, options, training graphs, and the chain on CPU.

With TensorRT and a GPU (marker `tensorrt`): engines built, run and matched against eager,
and a second compile served from the engine cache.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import backends
from backends.errors import InvalidOption, Unsupported
from backends.tensorrt import available
from backends.tensorrt.aten import to_aten
from backends.tensorrt.availability import (
    NO_CUDA,
    NOT_INSTALLED,
    check_devices,
    check_inference_graph,
)
from backends.tensorrt.settings import Settings
from chain import Status, chain
from tests.helpers import compile_and_check
from tests.models import build
from tests.trt.helpers import dynamo_graph

needs_no_tensorrt = pytest.mark.skipif(
    importlib.util.find_spec("tensorrt") is not None, reason="tensorrt is installed here"
)


needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here")
HERE = NO_CUDA if not torch.cuda.is_available() else NOT_INSTALLED  # why not, on this machine


@needs_no_cuda
def test_without_a_device_the_reason_is_the_device_not_the_package() -> None:
    assert available() == NO_CUDA == "no CUDA device (torch.cuda.is_available() is False)"
    assert backends.lookup_backend("tensorrt").available() == NO_CUDA


@needs_no_tensorrt
def test_with_a_device_and_no_package_the_reason_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the decision, not a GPU
    assert (
        available()
        == NOT_INSTALLED
        == "tensorrt is not installed: pip install 'backend-chain[gpu]'"
    )


@needs_no_tensorrt
def test_direct_call_without_tensorrt_is_unsupported_with_reason() -> None:
    gm, inputs, _ = dynamo_graph("mlp")
    with torch.no_grad(), pytest.raises(Unsupported) as info:
        backends.lookup_backend("tensorrt")(gm, inputs)
    assert info.value.reason == HERE


def test_training_graph_is_unsupported() -> None:
    x = torch.randn(2, 3, requires_grad=True)
    with pytest.raises(Unsupported, match=r"training graph: 1 input\(s\) require grad"):
        check_inference_graph([torch.randn(2), x])
    with torch.no_grad():
        check_inference_graph([x])  # no autograd recorded: an inference graph
    gm, inputs, _ = dynamo_graph("mlp")  # parameters require grad; grad mode is on here
    with pytest.raises(Unsupported, match="training graph"):
        backends.lookup_backend("tensorrt")(gm, inputs)


def test_cpu_inputs_and_symbolic_sizes_are_unsupported() -> None:
    with pytest.raises(Unsupported, match="inputs on cpu: TensorRT engines run on CUDA tensors"):
        check_devices([torch.randn(2)])
    gm, inputs, _ = dynamo_graph("mlp")
    with pytest.raises(Unsupported, match=r"dynamic shapes: input\(s\) \[0\] are symbolic"):
        to_aten(gm, [4, *inputs[1:]])


def test_options_are_declared_and_validated() -> None:
    backend = backends.lookup_backend("tensorrt")
    assert {"min_block_size", "torch_executed_ops", "require_full_compilation"} <= backend.options
    assert {"workspace_size", "optimization_level", "cache_dir"} <= backend.options
    with pytest.raises(InvalidOption, match="does not accept option"):
        backend.check_options({"precision": "fp16"})
    with pytest.raises(InvalidOption, match="min_block_size must be an int >= 1"):
        Settings.from_options({"min_block_size": 0})
    with pytest.raises(InvalidOption, match="optimization_level must be <= 5"):
        Settings.from_options({"optimization_level": 9})
    settings = Settings.from_options({"torch_executed_ops": ["torch.ops.aten.gelu", "aten.relu"]})
    assert settings.torch_executed_ops == {"aten.gelu", "aten.relu"}


@needs_no_tensorrt
@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_chain_records_unavailable_and_runs_eager(name: str) -> None:
    model, args = build(name)
    b = chain("tensorrt", "eager", options={"tensorrt": {"min_block_size": 3}})
    compile_and_check(model, args, b)
    (record,) = b.report.graphs
    first, second = record.attempts
    assert (first.backend, first.status, first.reason) == (
        "tensorrt",
        Status.UNAVAILABLE,
        HERE,
    )
    assert (second.backend, second.status) == ("eager", Status.WON)
    assert record.winner == "eager"


@pytest.mark.tensorrt
@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_engines_build_run_and_match_eager(name: str, tmp_path: Path) -> None:
    model, args = build(name)
    model, args = model.cuda(), tuple(a.cuda() for a in args)
    options = {"tensorrt": {"cache_dir": str(tmp_path)}}
    b = chain("tensorrt", "eager", options=options, eager_floor=False)  # small: eager may be faster
    compile_and_check(model, args, b, rtol=1e-3, atol=1e-3)
    (record,) = b.report.graphs
    won = record.attempts[0]
    assert (won.backend, won.status) == ("tensorrt", Status.WON), won.reason
    assert won.details["engines"] == 1 and won.details["cache_hits"] == 0
    assert won.details["ops_tensorrt"] == won.details["ops_total"]


@pytest.mark.tensorrt
def test_second_compile_hits_the_engine_cache(tmp_path: Path) -> None:
    model, args = build("cnn")
    model, args = model.cuda(), tuple(a.cuda() for a in args)
    options = {"tensorrt": {"cache_dir": str(tmp_path)}}
    first = chain("tensorrt", "eager", options=options)
    compile_and_check(model, args, first, rtol=1e-3, atol=1e-3)
    torch._dynamo.reset()
    second = chain("tensorrt", "eager", options=options)
    compile_and_check(model, args, second, rtol=1e-3, atol=1e-3)
    (built,), (reused,) = first.report.graphs[0].attempts[:1], second.report.graphs[0].attempts[:1]
    assert built.details["cache_hits"] == 0 and reused.details["cache_hits"] == 1
    assert reused.details["builds"][0]["cache_key"] == built.details["builds"][0]["cache_key"]
    assert (tmp_path / "timing.cache").stat().st_size > 0


def test_parser_rejection_keeps_the_block_in_pytorch_with_reasons() -> None:
    from backends.tensorrt.backend import _parser_fallback
    from backends.tensorrt.conversion.engine import ParseFailed, ParserIssue
    from backends.tensorrt.partitioning import PartitionOptions
    from backends.tensorrt.pipeline import plan

    gm, inputs, expected = dynamo_graph("cnn")
    the_plan = plan(gm, inputs, PartitionOptions())
    (name,) = the_plan.result.blocks
    error = ParseFailed([ParserIssue(3, "node_Conv_3", "Conv", "unsupported dilation")])
    assert error.reason == "TensorRT's ONNX parser rejected 1 node(s) (Conv)"
    assert error.detail == "Conv node node_Conv_3: unsupported dilation"
    _parser_fallback(the_plan, name, error)
    result = the_plan.result
    assert result.blocks == [] and result.ops_compiled == 0
    reason = f"TensorRT parser: {error.reason}"
    assert result.fallback["aten.conv2d.default"] == {reason: 2}
    assert sum(sum(r.values()) for r in result.fallback.values()) == result.ops_total == 9
    torch.testing.assert_close(the_plan.gm(*inputs)[0], expected)  # the block runs in PyTorch


def test_compiled_graph_refuses_weights_changed_after_freezing() -> None:
    from backends.tensorrt.partitioning import PartitionOptions
    from backends.tensorrt.pipeline import plan
    from backends.tensorrt.runtime.compiled import CompiledGraph

    gm, inputs, expected = dynamo_graph("mlp")
    the_plan = plan(gm, inputs, PartitionOptions())
    compiled = CompiledGraph(the_plan.gm, the_plan.frozen_inputs, inputs, {"engines": 1})
    assert compiled.chain_details == {"engines": 1}
    with torch.no_grad():
        torch.testing.assert_close(compiled(*inputs)[0], expected)
        weight = inputs[the_plan.frozen_inputs[0]]
        weight.add_(1.0)
        with pytest.raises(RuntimeError, match=r"weight input 0 changed after TensorRT froze it"):
            compiled(*inputs)
        weight.sub_(1.0)
