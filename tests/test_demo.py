"""`chain demo`: on the machine it runs on (CUDA fp16 when there), a real model, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from chain import Report
from chain.demo import choose_device, choose_model, main


@pytest.mark.parametrize(
    ("device", "dtype", "cuda", "expected"),
    [
        ("auto", "auto", True, (torch.device("cuda"), torch.float16)),
        ("auto", "auto", False, (torch.device("cpu"), torch.float32)),
        ("cpu", "auto", True, (torch.device("cpu"), torch.float32)),
        ("cuda", "bfloat16", True, (torch.device("cuda"), torch.bfloat16)),
    ],
)
def test_device_and_dtype_follow_the_machine(
    device: str, dtype: str, cuda: bool, expected: tuple[torch.device, torch.dtype]
) -> None:
    assert choose_device(device, dtype, cuda) == expected


def test_impossible_device_choices_say_why() -> None:
    with pytest.raises(ValueError, match="no CUDA device here"):
        choose_device("cuda", "auto", False)
    with pytest.raises(ValueError, match="float16 on cpu"):
        choose_device("cpu", "float16", False)


def test_the_model_is_a_transformers_one_when_transformers_is_there() -> None:
    pytest.importorskip("transformers")
    assert choose_model("auto") == "bert"
    assert choose_model("resnet") == "resnet"


def test_demo_says_where_it_ran_and_points_at_the_users_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("transformers")
    saved = tmp_path / "demo.json"
    assert main(["--model", "bert", "--backends", "eager", "--save", str(saved)]) == 0
    out = capsys.readouterr().out
    expected = "device: cuda (" if torch.cuda.is_available() else "device: cpu ("
    assert expected in out
    assert ("dtype: float16" if torch.cuda.is_available() else "dtype: float32") in out
    report = Report.load(saved)
    assert [g.winner for g in report.graphs] == ["eager", "eager"]
    assert all("demo.py:" in g.origin for g in report.graphs)  # the demo's forward, not BERT's
    assert not any("random ops" in n for g in report.graphs for n in g.notes)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--backends", "onnxrutime"], "'onnxrutime' (did you mean 'onnxruntime'?)"),
        (["--device", "cpu", "--dtype", "float16"], "--dtype float16 on cpu"),
    ],
)
def test_bad_demo_arguments_are_one_line_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("chain demo: error: ") and message in err


@pytest.mark.cuda
def test_demo_runs_on_cuda_in_float16(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "demo.json"
    assert main(["--backends", "onnxruntime", "eager", "--save", str(saved)]) == 0
    assert "dtype: float16" in capsys.readouterr().out
    report = Report.load(saved)
    inputs = [i for g in report.graphs for i in g.inputs if "device" in i]
    assert inputs and all(i["device"].startswith("cuda") for i in inputs)
    assert any(i["dtype"] == "float16" for i in inputs)
