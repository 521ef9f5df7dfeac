"""chain.export: programs with ONNX Runtime payloads, save/load in a fresh process, errors."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import chain
from backends.common.payload import digest, specs_to_str, to_tensor
from backends.errors import Unsupported
from backends.tensorrt.deploy import check_tensorrt
from chain.deploy import (
    CaptureError,
    Header,
    OutputSpec,
    PayloadError,
    PayloadMismatch,
    RuntimeMissing,
    cache_info,
    clear_cache,
    pack,
)
from tests.models import build, build_extra

ROUND_TRIP = ("cnn", "transformer", "kthvalue")
OP = torch.ops.backend_chain.run_payload.default


def _model(name: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    return build_extra(name) if name == "kthvalue" else build(name)


def _export(name: str, **kwargs: Any) -> chain.ExportResult:
    model, args = _model(name)
    backend = chain.chain("onnxruntime", "eager", measure=False)
    return chain.export(model, args, backend=backend, **kwargs)


def _payload_calls(program: torch.export.ExportedProgram) -> list[torch.fx.Node]:
    return [n for n in program.graph.nodes if n.target is OP]


def _aten_ops(program: torch.export.ExportedProgram) -> set[str]:
    return {str(n.target) for n in program.graph.nodes if n.op == "call_function"}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Export the round-trip models, save them, load and run them all in one fresh process."""
    folder = tmp_path_factory.mktemp("programs")
    results = {}
    for name in ROUND_TRIP:
        result = _export(name)
        torch.export.save(result.program, folder / f"{name}.pt2")
        results[name] = result
    script = textwrap.dedent(
        f"""
        import json, sys, torch
        import chain
        from chain.deploy import cache_info
        from tests.models import build, build_extra
        facts = {{}}
        for name in {list(ROUND_TRIP)!r}:
            model, args = build_extra(name) if name == "kthvalue" else build(name)
            program = torch.export.load(r"{folder}/" + name + ".pt2")
            module = program.module()
            before = cache_info()["built"]
            outs = [module(*args) for _ in range(3)]
            torch.save(outs[-1], r"{folder}/" + name + ".out")
            facts[name] = {{"built": cache_info()["built"] - before,
                           "same": all(torch.equal(o, outs[0]) for o in outs)}}
        print(json.dumps(facts))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    return {"folder": folder, "results": results, "facts": facts}


@pytest.mark.parametrize("name", ROUND_TRIP)
def test_round_trip_in_fresh_process_matches_eager(name: str, saved: dict[str, Any]) -> None:
    model, args = _model(name)
    with torch.no_grad():
        expected = model(*args)
    actual = torch.load(saved["folder"] / f"{name}.out")
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)
    assert saved["facts"][name] == {"built": len(saved["results"][name].parts), "same": True}


@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_ort_winner_is_one_payload_and_no_weights(name: str, saved: dict[str, Any]) -> None:
    result = saved["results"][name]
    program = result.program
    assert len(_payload_calls(program)) == 1
    assert [a.backend for a in result.report.graphs[0].attempts][:1] == ["onnxruntime"]
    assert result.report.graphs[0].winner == "onnxruntime"
    assert "whole graph" in result.report.graphs[0].notes[-1]
    assert not program.state_dict  # the weights live in the ONNX model
    [constant] = program.constants.values()
    assert constant.dtype == torch.uint8
    header, _ = chain.deploy.unpack(constant.numpy().tobytes())
    assert header.backend == "onnxruntime"
    assert header.version == __import__("onnxruntime").__version__
    assert header.opset and header.opset >= 18
    assert result.parts[0]["backend"] == "onnxruntime"


def test_mixed_program_has_ort_and_pytorch_parts(saved: dict[str, Any]) -> None:
    result = saved["results"]["kthvalue"]
    record = result.report.graphs[0]
    ort = next(a for a in record.attempts if a.backend == "onnxruntime")
    assert ort.status is chain.Status.UNSUPPORTED and "kthvalue" in ort.reason
    assert len(_payload_calls(result.program)) == 1
    assert "aten.kthvalue.default" in _aten_ops(result.program)
    assert "no ONNX translation" in next(iter(result.fallback["aten.kthvalue.default"]))
    assert "PyTorch kept aten.kthvalue.default" in record.notes[-1]
    assert set(result.program.state_dict) == set()  # fc's weights moved into the ONNX part


def test_torch_executed_ops_splits_the_graph() -> None:
    model, args = build("mlp")
    result = _export("mlp", torch_executed_ops=("aten.gelu",))
    assert len(_payload_calls(result.program)) == 2
    assert "aten.gelu.default" in _aten_ops(result.program)
    assert result.fallback == {"aten.gelu.default": {"excluded by torch_executed_ops": 1}}
    with torch.no_grad():
        torch.testing.assert_close(result.program.module()(*args), model(*args))


def test_fake_implementation_gives_output_shapes() -> None:
    result = _export("two_outputs")
    [call] = _payload_calls(result.program)
    model, args = build("two_outputs")
    with torch.no_grad():
        expected = model(*args)
    shapes = [(tuple(v.shape), v.dtype) for v in call.meta["val"]]
    assert shapes == [(tuple(e.shape), e.dtype) for e in expected]
    specs = [OutputSpec((3, 5), "float16"), OutputSpec((7,), "int64")]
    with FakeTensorMode() as mode:
        x = mode.from_tensor(torch.randn(3, 5))
        payload = mode.from_tensor(torch.zeros(10, dtype=torch.uint8))
        outs = OP([x], payload, specs_to_str(specs))
    shapes = [(tuple(o.shape), o.dtype) for o in outs]
    assert shapes == [((3, 5), torch.float16), ((7,), torch.int64)]


def test_session_is_built_once_per_payload() -> None:
    result = _export("mlp")
    module = result.program.module()
    _, args = build("mlp")
    clear_cache()
    before = cache_info()["built"]
    for _ in range(3):
        module(*args)
    assert cache_info()["built"] - before == 1


def _header(**overrides: Any) -> Header:
    fields: dict[str, Any] = {
        "backend": "tensorrt",
        "version": "10.3.0",
        "sha256": digest(b"engine"),
        "input_names": ("x",),
        "output_names": ("y",),
        "outputs": (OutputSpec((4, 16), "float32"),),
        "device": "cuda",
        "gpu": "NVIDIA H100 80GB HBM3",
        "compute_capability": "9.0",
    }
    fields.update(overrides)
    return Header(**fields)


def _call(header: Header, body: bytes) -> Any:
    payload = to_tensor(pack(header, body))
    return OP([torch.randn(4, 16)], payload, specs_to_str(list(header.outputs)))


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("tensorrt") is not None, reason="tensorrt is installed"
)
def test_tensorrt_payload_without_tensorrt_names_the_install(tmp_path: Path) -> None:
    with pytest.raises(RuntimeMissing, match=r"pip install 'backend-chain\[gpu\]'") as info:
        _call(_header(), b"engine")
    assert "TensorRT engine built with tensorrt 10.3.0 on NVIDIA H100" in str(info.value)

    class Deployed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.payload = to_tensor(pack(_header(), b"engine"))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return OP([x], self.payload, specs_to_str([OutputSpec((4, 16), "float32")]))[0]

    program = torch.export.export(Deployed(), (torch.randn(4, 16),))
    torch.export.save(program, tmp_path / "trt.pt2")
    loaded = torch.export.load(tmp_path / "trt.pt2").module()
    with pytest.raises(RuntimeMissing, match=r"tensorrt is not installed"):
        loaded(torch.randn(4, 16))


def test_tensorrt_version_and_gpu_mismatch_are_clear() -> None:
    header = _header()
    check_tensorrt(header, "10.3.0", "NVIDIA H100 80GB HBM3", "9.0")
    with pytest.raises(PayloadMismatch, match=r"TensorRT 10\.3\.0, this process has 11\.0\.0"):
        check_tensorrt(header, "11.0.0", "NVIDIA H100 80GB HBM3", "9.0")
    with pytest.raises(PayloadMismatch, match=r"built on NVIDIA H100.*this device is NVIDIA L4"):
        check_tensorrt(header, "10.3.0", "NVIDIA L4", "8.9")
    with pytest.raises(RuntimeMissing, match="no CUDA device"):
        check_tensorrt(header, "10.3.0", None, None)


def test_onnx_model_from_newer_onnxruntime_is_refused() -> None:
    header = _header(backend="onnxruntime", version="99.1.0", gpu=None, device="cpu", opset=18)
    with pytest.raises(PayloadMismatch, match=r"onnxruntime 99\.1\.0 \(opset 18\).*pip install -U"):
        _call(header, b"engine")


def test_corrupted_or_foreign_payload_is_refused() -> None:
    header = _header(backend="onnxruntime", version="1.0.0", gpu=None, device="cpu")
    with pytest.raises(PayloadError, match="corrupted"):
        _call(header, b"engina")
    with pytest.raises(PayloadError, match="bad magic"):
        OP([torch.randn(2)], torch.zeros(64, dtype=torch.uint8), "[]")


class DataDependent(torch.nn.Module):
    """A Python branch on a tensor's value: no single graph for torch.export."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x * 2
        return x - 1


def test_model_that_cannot_be_captured_names_the_construct() -> None:
    with pytest.raises(CaptureError) as info:
        chain.export(DataDependent(), (torch.randn(3),))
    message = str(info.value)
    assert "could not capture DataDependent as one graph" in message
    assert "data-dependent" in message
    assert "test_export.py" in message  # points at the user's line


@pytest.mark.tensorrt
@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_tensorrt_round_trip(name: str, tmp_path: Path) -> None:
    model, args = _model(name)
    model, args = model.cuda(), tuple(a.cuda() for a in args)
    result = chain.export(model, args, backend=chain.chain("tensorrt", "eager", measure=False))
    assert result.report.graphs[0].winner == "tensorrt"
    calls = _payload_calls(result.program)
    assert calls
    torch.export.save(result.program, tmp_path / "trt.pt2")
    loaded = torch.export.load(tmp_path / "trt.pt2").module()
    with torch.no_grad():
        torch.testing.assert_close(loaded(*args), model(*args), rtol=2e-3, atol=2e-3)


def _refuse_first_part(real: Any) -> Any:
    """`export_part` that refuses block `_run_on_acc_0`, as ONNX Runtime refuses a block."""

    def export_part(name: str, *args: Any) -> Any:
        if name.endswith("_0"):
            raise Unsupported("refused for the test")
        return real(name, *args)

    return export_part


def test_refused_block_with_weights_stays_pytorch_and_loads(tmp_path: Path) -> None:
    """Regression (Swin, T5 encoder): a refused block's weights were lifted as Parameter
    constants and `program.module()` failed to re-register them."""
    from backends.onnxruntime import partition

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)
    ).eval()
    x = torch.randn(2, 4)
    backend = chain.chain("onnxruntime", "eager", measure=False)
    refuse = _refuse_first_part(partition.export_part)
    with mock.patch.object(partition, "export_part", refuse):
        result = chain.export(model, (x,), backend=backend, torch_executed_ops=["aten.relu"])
    assert [p["name"] for p in result.parts] == ["_run_on_acc_1"]
    assert "onnxruntime: refused for the test" in result.fallback["aten.linear.default"]
    assert "aten.linear.default" in _aten_ops(result.program)
    torch.export.save(result.program, tmp_path / "refused.pt2")
    loaded = torch.export.load(tmp_path / "refused.pt2").module()
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x))
        assert not any(p.requires_grad for p in result.program.constants.values())
