"""The onnxruntime backend on CPU: parity, initializers, zero-copy inputs, refusals, options."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import pytest
import torch

from backends import Unsupported, lookup_backend
from backends.onnxruntime import FrozenWeightChanged, OrtRunner
from tests.models import MODELS, build, build_extra

BACKEND = lookup_backend("onnxruntime")


@dataclass
class Run:
    """A model compiled through the backend once, its outputs, and what the backend built."""

    model: torch.nn.Module
    args: tuple[torch.Tensor, ...]
    runners: list[OrtRunner] = field(default_factory=list)
    refusals: list[Unsupported] = field(default_factory=list)
    outputs: Any = None
    expected: Any = None


def capturing(run: Run, **options: Any) -> Callable[..., Any]:
    """A dynamo backend that compiles with onnxruntime and keeps runners and refusals."""

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        try:
            runner = BACKEND(gm, example_inputs, **options)
        except Unsupported as error:
            run.refusals.append(error)
            return gm.forward
        run.runners.append(runner)
        return runner

    return backend


def compile_and_run(name: str, **options: Any) -> Run:
    model, args = build(name) if name in MODELS else build_extra(name)
    run = Run(model, args)
    torch._dynamo.reset()
    with torch.no_grad():
        run.outputs = torch.compile(model, backend=capturing(run, **options))(*args)
        run.expected = model(*args)
    return run


@pytest.fixture(scope="module")
def runs() -> dict[str, Run]:
    """Every test model compiled once (export is slow); tests read what it produced."""
    return {name: compile_and_run(name) for name in MODELS}


@pytest.mark.parametrize("name", MODELS)
def test_matches_eager(runs: dict[str, Run], name: str) -> None:
    run = runs[name]
    assert run.refusals == []
    torch.testing.assert_close(run.outputs, run.expected, rtol=1e-4, atol=1e-4)


def test_graph_break_runs_both_graphs_through_ort(runs: dict[str, Run]) -> None:
    run = runs["graph_break"]
    assert len(run.runners) == 2
    assert all(r.chain_details["providers"] == ["CPUExecutionProvider"] for r in run.runners)


@pytest.mark.parametrize("name", MODELS)
def test_weights_are_initializers(runs: dict[str, Run], name: str) -> None:
    for runner in runs[name].runners:
        model = onnx.load_from_string(runner.chain_payload)
        initializers = {t.name for t in model.graph.initializer}
        inputs = [i.name for i in model.graph.input if i.name not in initializers]
        assert len(inputs) == 1, inputs  # the model's one data input, no weights
        assert len(initializers) == runner.chain_details["initializers"] > 0
        assert runner.chain_details["frozen_inputs"]


def test_fused_encoder_fast_path_is_spelled_out(runs: dict[str, Run]) -> None:
    (runner,) = runs["transformer"].runners
    assert runner.chain_details["decomposed"] == ["_transformer_encoder_layer_fwd"]


def test_details_name_providers_and_opset(runs: dict[str, Run]) -> None:
    details = runs["cnn"].runners[0].chain_details
    assert details["providers"] == ["CPUExecutionProvider"]
    assert details["opset"] >= 18
    assert details["model_bytes"] == len(runs["cnn"].runners[0].chain_payload)


def test_cpu_inputs_are_not_copied(runs: dict[str, Run]) -> None:
    run = runs["mlp"]
    (runner,) = run.runners
    x = run.args[0]
    frozen = runner.chain_details["frozen_inputs"]
    args: list[Any] = [None] * (len(frozen) + 1)
    args[next(p for p in range(len(args)) if p not in frozen)] = x
    (view,) = runner.feeds(args).values()
    assert view.ctypes.data == x.data_ptr()
    assert np.shares_memory(view, x.numpy())


def test_non_contiguous_then_contiguous_input() -> None:
    """A transposed input (numpy strided view), then a contiguous one: dynamo recompiles
    with a dynamic stride the graph never reads, which must not stop the export."""
    model, _ = build("two_outputs")
    run = Run(model, ())
    compiled = torch.compile(model, backend=capturing(run))
    with torch.no_grad():
        for x in (torch.randn(16, 4).t(), torch.randn(4, 16)):
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert run.refusals == [] and len(run.runners) == 2


def test_unsupported_op_raises_with_exporter_reason() -> None:
    run = compile_and_run("kthvalue")
    (refusal,) = run.refusals
    assert "aten.kthvalue" in refusal.reason
    assert "\n" not in refusal.reason and len(refusal.reason) <= 240
    assert refusal.detail and "kthvalue" in refusal.detail


def test_training_graph_is_unsupported() -> None:
    model, args = build("mlp")
    run = Run(model, args)
    torch.compile(model, backend=capturing(run))(*args)  # grad mode on, params need grad
    (refusal,) = run.refusals
    assert refusal.reason.startswith("training graph")


def test_dynamic_batch_is_one_graph_for_all_sizes() -> None:
    model, _ = build("mlp")
    run = Run(model, ())
    compiled = torch.compile(model, backend=capturing(run), dynamic=True)
    with torch.no_grad():
        for batch in (2, 5, 9):
            x = torch.randn(batch, 32)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    (runner,) = run.runners
    assert list(runner.chain_details["dynamic_dims"].values()) == [[0]]


@pytest.mark.parametrize("policy", ["reexport", "raise"])
def test_in_place_weight_change_is_noticed(policy: str) -> None:
    model, (x,) = build("two_outputs")
    run = Run(model, (x,))
    compiled = torch.compile(model, backend=capturing(run, on_weight_change=policy))
    with torch.no_grad():
        compiled(x)
        model.fc.weight.mul_(2.0)
        if policy == "raise":
            with pytest.raises(FrozenWeightChanged, match="changed after export"):
                compiled(x)
            return
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert run.runners[0].refreshes == 1  # new initializer values, or a re-export


def test_options_reach_the_session() -> None:
    run = compile_and_run("mlp", intra_op_num_threads=1, graph_optimization_level="basic")
    session = run.runners[0].session
    options = session.get_session_options()
    assert options.intra_op_num_threads == 1
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert BACKEND.options is not None and "providers" in BACKEND.options


def test_bad_optimization_level_names_the_valid_ones() -> None:
    model, args = build("mlp")
    gm = torch.fx.symbolic_trace(model)
    with pytest.raises(ValueError, match="disable, basic, extended, all"):
        BACKEND(gm, list(args), graph_optimization_level="max")


def test_exporter_console_output_is_silenced(capfd: pytest.CaptureFixture[str]) -> None:
    compile_and_run("two_outputs")
    out, err = capfd.readouterr()
    assert "torch.onnx" not in out + err and "torchvision" not in err, out + err


@pytest.mark.ort_cuda
@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_cuda_parity_through_iobinding(name: str) -> None:
    model, args = build(name)
    model, args = model.cuda(), tuple(a.cuda() for a in args)
    run = Run(model, args)
    with torch.no_grad():
        out = torch.compile(model, backend=capturing(run))(*args)
        torch.testing.assert_close(out, model(*args), rtol=1e-3, atol=1e-3)
    assert run.runners and "CUDAExecutionProvider" in run.runners[0].chain_details["providers"]
    assert out.device.type == "cuda"


def test_cuda_parity_skips_with_its_reason_without_the_cuda_provider(
    request: pytest.FixtureRequest,
) -> None:
    """On a GPU machine whose onnxruntime is the CPU build, the CUDA test skips, not fails."""
    import onnxruntime

    from tests.conftest import _ort_cuda_reason

    item = next(
        i for i in request.session.items if i.name.startswith("test_cuda_parity_through_iobinding")
    )
    reason = _ort_cuda_reason()
    cuda_ep = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    assert (reason is None) == (torch.cuda.is_available() and cuda_ep)
    if reason is not None:
        skips = [m.kwargs.get("reason") for m in item.iter_markers("skip")]
        assert skips == [reason]


def test_tensorrt_ep_probe_says_why_not_without_its_library() -> None:
    """onnxruntime (CPU) ships no TensorRT EP library: the probe says so, quietly."""
    from backends.onnxruntime.session import tensorrt_ep_loads

    reason = tensorrt_ep_loads()
    assert reason is not None and "TensorRT EP" in reason


@pytest.mark.ort_cuda
def test_tensorrt_ep_is_chosen_only_when_it_loads() -> None:
    from backends.onnxruntime.session import default_providers, tensorrt_ep_loads

    names = [p if isinstance(p, str) else p[0] for p in default_providers(torch.device("cuda"))]
    assert ("TensorrtExecutionProvider" in names) == (tensorrt_ep_loads() is None)
    assert names[-2:] == ["CUDAExecutionProvider", "CPUExecutionProvider"]


@pytest.mark.ort_cuda
def test_cuda_on_a_side_stream_and_in_place_writes() -> None:
    """Called from another stream than the one ORT was bound to, and writing to its input:
    the streams wait on each other on the device, and the write lands in the caller's x."""

    def f(x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return x * 2

    x = torch.randn(64, device="cuda")
    expected_x, expected = x + 1, (x + 1) * 2
    compiled = torch.compile(f, backend=BACKEND)
    with torch.no_grad():
        compiled(x.clone())  # compiled on the default stream
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            out = compiled(x)
        torch.cuda.current_stream().wait_stream(side)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x, expected_x)
