"""The real-model suite: `--suite real --quick` builds and runs on CPU, or says why per model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from chain import chain
from chain.bench import run
from chain.bench.peers import ORT_DIRECT, REDUCE_OVERHEAD
from chain.bench.real_models import REAL_SUITE, TIMM, TRANSFORMERS


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
    outs = out if isinstance(out, tuple) else (out,)  # a decode step: logits and its cache
    assert outs and all(isinstance(o, torch.Tensor) and torch.isfinite(o).all() for o in outs)
    assert sum(p.numel() for p in model.parameters()) < 5_000_000  # tiny: quick on CPU


@pytest.mark.skipif(TRANSFORMERS() is not None, reason=str(TRANSFORMERS()))
def test_decode_step_grows_its_cache_by_one_token_and_runs_on_onnxruntime() -> None:
    model, inputs = REAL_SUITE["gpt2_decode"].build(None, torch.device("cpu"), torch.float32, True)
    _, *cache = inputs
    backend = chain("onnxruntime", "eager", memory=False, measure=False)
    with torch.no_grad():
        want = model(*inputs)
        got = torch.compile(model, backend=backend)(*inputs)
    logits, *grown = want
    assert logits.shape == (1, 1, 256) and len(grown) == len(cache) == 4
    for new, old in zip(grown, cache, strict=True):
        assert new.shape[2] == old.shape[2] + 1
        torch.testing.assert_close(new[:, :, :-1], old)  # the past as it was, one token added
    (graph,) = backend.report.graphs
    assert graph.winner == "onnxruntime", graph.attempts
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


def test_model_of_another_suite_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        run.parse_args(["--suite", "real", "--models", "mlp"])
    assert "not in --suite real" in capsys.readouterr().err
