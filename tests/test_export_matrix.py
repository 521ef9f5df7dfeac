"""chain.export on ten transformers architectures, loaded in a fresh process; damaged files.

Each architecture (tiny config, random weights, CPU) is exported with
chain("onnxruntime", "eager"), saved, loaded with `chain.load` in one fresh process and
run there; its outputs must match eager's and it must have at least one ONNX Runtime part.
A model torch.export itself cannot capture is skipped with torch's reason.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import chain
from backends.common.payload import (
    Header,
    PayloadError,
    PayloadMismatch,
    TensorSpec,
    digest,
    pack,
    specs_to_str,
    to_tensor,
)
from chain.bench.export_zoo import ARCHITECTURES, build, leaves
from tests.models import MLP

pytest.importorskip("transformers")
OP = torch.ops.backend_chain.run_payload.default
ROOT = Path(__file__).resolve().parent.parent


def _ort_parts(result: chain.ExportResult) -> int:
    return sum(1 for p in result.parts if p["backend"] == "onnxruntime")


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Export and save every architecture; load and run them all in one fresh process."""
    folder = tmp_path_factory.mktemp("matrix")
    results: dict[str, chain.ExportResult] = {}
    skipped: dict[str, str] = {}
    for name in ARCHITECTURES:
        model, args = build(name)
        backend = chain.chain("onnxruntime", "eager", measure=False)
        try:
            result = chain.export(model, args, backend=backend)
        except chain.CaptureError as error:
            skipped[name] = str(error)
            continue
        torch.export.save(result.program, folder / f"{name}.pt2")
        results[name] = result
    script = textwrap.dedent(
        f"""
        import json, torch
        import chain
        from chain.bench.export_zoo import build, leaves
        folder, names = r"{folder}", {sorted(results)!r}
        facts = {{}}
        import warnings
        with warnings.catch_warnings(record=True) as caught:  # before the classes' module
            warnings.simplefilter("always")
            unregistered = chain.load(folder + "/" + names[0] + ".pt2")
        facts["unregistered"] = [str(w.message) for w in caught]
        facts["stand_in"] = type(unregistered.module()(*build(names[0])[1])).__name__
        import transformers.modeling_outputs  # after a stand-in took the name: the class
        for name in names:
            _, args = build(name)
            program = chain.load(folder + "/" + name + ".pt2")
            with torch.no_grad():
                outs = leaves(program.module()(*args))
            torch.save(outs, folder + "/" + name + ".out")
        print(json.dumps(facts))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    return {"folder": folder, "results": results, "skipped": skipped, "facts": facts}


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_architecture_exports_loads_and_matches_eager(name: str, matrix: dict[str, Any]) -> None:
    if name in matrix["skipped"]:
        pytest.skip(f"torch.export cannot capture {name}: {matrix['skipped'][name]}")
    result = matrix["results"][name]
    assert _ort_parts(result) >= 1, result.report.graphs[0].notes
    model, args = build(name)
    with torch.no_grad():
        expected = leaves(model(*args))
    actual = torch.load(matrix["folder"] / f"{name}.out")
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4)


def test_swin_exports_with_ort_parts(matrix: dict[str, Any]) -> None:
    """Regression: SwinModel crashed in `program.module()` (a refused block's weights were
    Parameter constants) after ONNX Runtime refused parts traced with gradients on."""
    result = matrix["results"]["swin"]
    assert _ort_parts(result) == len(result.parts) >= 1
    assert not result.fallback  # no part left to PyTorch


def test_unregistered_output_class_is_a_stand_in_with_one_warning(
    matrix: dict[str, Any],
) -> None:
    """Loaded before transformers.modeling_outputs: a stand-in (issue 36), one warning;
    imported after: every later program returns the class itself (compared above)."""
    [message] = matrix["facts"]["unregistered"]
    assert "transformers.modeling_outputs." in message and "stand-ins" in message
    assert matrix["facts"]["stand_in"].startswith("BaseModelOutput")


def _mlp_program(seed: int) -> torch.export.ExportedProgram:
    torch.manual_seed(seed)
    model = MLP().eval()
    backend = chain.chain("onnxruntime", "eager", measure=False)
    return chain.export(model, (torch.randn(4, 32),), backend=backend).program


@pytest.fixture(scope="module")
def saved_mlp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("damage") / "mlp.pt2"
    torch.export.save(_mlp_program(0), path)
    return path


def _one_line(error: pytest.ExceptionInfo[BaseException]) -> str:
    message = str(error.value)
    assert "\n" not in message and message
    return message


def test_swapped_payload_is_a_mismatch_naming_the_part(tmp_path: Path) -> None:
    program, other = _mlp_program(0), _mlp_program(1)
    [name] = program.constants
    program.constants[name] = other.constants[name]  # a valid payload of another model
    torch.export.save(program, tmp_path / "swapped.pt2")
    with pytest.raises(PayloadMismatch) as info:
        chain.load(tmp_path / "swapped.pt2")
    assert "part _run_on_acc_whole is not the one this program was built with" in _one_line(info)
    loaded = torch.export.load(tmp_path / "swapped.pt2").module()  # torch's own loader
    with pytest.raises(PayloadMismatch, match="_run_on_acc_whole"):
        loaded(torch.randn(4, 32))


def test_truncated_file_is_one_line(saved_mlp: Path, tmp_path: Path) -> None:
    data = saved_mlp.read_bytes()
    (tmp_path / "cut.pt2").write_bytes(data[: len(data) // 2])
    with pytest.raises(PayloadError) as info:
        chain.load(tmp_path / "cut.pt2")
    assert "truncated or corrupted" in _one_line(info)


def test_flipped_byte_is_one_line(saved_mlp: Path, tmp_path: Path) -> None:
    data = bytearray(saved_mlp.read_bytes())
    at = data.index(b"BCHAIN1\0") + 200  # inside the payload's body
    data[at] ^= 0xFF
    (tmp_path / "flipped.pt2").write_bytes(bytes(data))
    with pytest.raises(PayloadError) as info:
        chain.load(tmp_path / "flipped.pt2")
    assert "corrupted (checksum mismatch in" in _one_line(info)


def test_not_a_zip_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "text.pt2").write_text("hello, not a program\n")
    with pytest.raises(PayloadError) as info:
        chain.load(tmp_path / "text.pt2")
    assert "not a readable .pt2 program" in _one_line(info)


def test_onnx_payload_with_external_data_is_refused(tmp_path: Path) -> None:
    import onnx
    from onnx import external_data_helper, helper

    weight = onnx.numpy_helper.from_array(torch.ones(4).numpy(), name="w")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    external_data_helper.convert_model_to_external_data(model, location="w.bin", size_threshold=0)
    body = model.SerializeToString()
    header = Header(
        "onnxruntime", __import__("onnxruntime").__version__, digest(body), ("x",), ("y",),
        (TensorSpec((4,), "float32"),), opset=18,
    )  # fmt: skip
    payload = to_tensor(pack(header, body))
    with pytest.raises(PayloadError) as info:
        OP([torch.randn(4)], payload, specs_to_str(list(header.outputs)))
    assert "reads 1 tensor(s) from external data files (w): refused" in _one_line(info)
