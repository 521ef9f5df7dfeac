"""The real-model suite: `--suite real --quick` builds and runs on CPU, or says why per model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from chain.bench import run
from chain.bench.peers import ORT_DIRECT, REDUCE_OVERHEAD
from chain.bench.real_models import REAL_SUITE, TIMM


def test_quick_real_suite_runs_with_peer_columns_and_reasons(tmp_path: Path) -> None:
    argv = ["--suite", "real", "--quick", "--models", "mlp_b1,resnet50", "--backends", "none"]
    argv += ["--chains", "onnxruntime,eager", "--modes", "fastest", "--repeats", "2"]
    assert run.main([*argv, "--warmup", "1", "--threads", "1", "--out", str(tmp_path)]) == 0
    torch._dynamo.reset()
    data = json.loads((tmp_path / "results.json").read_text())
    rows = {(r["model"], r["candidate"]): r for r in data["rows"]}
    assert data["meta"]["suite"] == "real"
    for label in ("eager", REDUCE_OVERHEAD, ORT_DIRECT, "chain(onnxruntime,eager)[fastest]"):
        row = rows[("mlp_b1", label)]
        assert row["status"] == "ok", row
        assert row["median_ms"] > 0 and row["max_abs_err"] < 1e-4
    resnet = [r for r in data["rows"] if r["model"] == "resnet50"]
    if TIMM() is None:  # timm imports here: the model ran like the others
        assert rows[("resnet50", "eager")]["status"] == "ok"
    else:  # one row that says why
        assert [(r["candidate"], r["status"], r["reason"]) for r in resnet] == [
            ("eager", "unavailable", TIMM())
        ]
    summary = (tmp_path / "summary.md").read_text()
    assert "## The chains against the best peer" in summary
    assert "| mlp_b1 | chain(onnxruntime,eager)[fastest] |" in summary


@pytest.mark.parametrize("name", [n for n, s in REAL_SUITE.items() if s.available() is None])
def test_real_models_build_tiny_and_run(name: str) -> None:
    model, inputs = REAL_SUITE[name].build(None, torch.device("cpu"), torch.float32, tiny=True)
    with torch.no_grad():
        out = model(*inputs)
    assert isinstance(out, torch.Tensor) and torch.isfinite(out).all()
    assert sum(p.numel() for p in model.parameters()) < 5_000_000  # tiny: quick on CPU


def test_model_of_another_suite_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        run.parse_args(["--suite", "real", "--models", "mlp"])
    assert "not in --suite real" in capsys.readouterr().err
