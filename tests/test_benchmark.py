"""The benchmark: a --quick smoke run's files and figures, failure rows, and bad arguments."""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import backends
from backends.errors import Unsupported
from chain.bench import run
from chain.bench.candidates import backend_candidate, thread_options
from chain.bench.harness import (
    Candidate,
    Compiled,
    Result,
    Settings,
    bench_model,
    failure,
)
from chain.bench.models import SUITE, default_models
from chain.bench.output import FIELDS, draw, geomeans

MODELS = ("mlp", "graph_break")
NEVER_REASON = "needs a machine that does not exist (test backend)"


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    """One --quick run into a temporary folder, with a registered backend that is unavailable."""
    out = tmp_path_factory.mktemp("bench")
    with backends.registry.snapshot() as reg:

        @reg.register("never", available=lambda: NEVER_REASON)
        def never(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
            raise AssertionError("an unavailable backend must not be called")

        argv = ["--quick", "--models", ",".join(MODELS), "--backends", "eager,never,tensorrt"]
        argv += ["--chains", "tensorrt,eager"]
        assert run.main([*argv, "--repeats", "3", "--out", str(out)]) == 0
    torch._dynamo.reset()
    yield out, json.loads((out / "results.json").read_text())


def test_every_output_file_is_written_and_parses(quick_run: tuple[Path, dict[str, Any]]) -> None:
    out, data = quick_run
    with (out / "results.csv").open() as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == FIELDS
        csv_rows = list(reader)
    labels = data["meta"]["candidates"]
    assert labels == [
        "eager", "dynamo-eager", "never", "tensorrt",
        "chain(tensorrt,eager)[first]", "chain(tensorrt,eager)[fastest]",
    ]  # fmt: skip
    assert len(csv_rows) == len(data["rows"]) == len(MODELS) * len(labels)
    assert [(r["model"], r["candidate"]) for r in csv_rows] == [
        (r["model"], r["candidate"]) for r in data["rows"]
    ]
    summary = (out / "summary.md").read_text()
    assert "## Geometric mean of speedups over eager" in summary
    assert "| eager | 1.00x | 2 |" in summary
    assert "| dynamo-eager |" in summary
    png = out / "speedups.png"
    if importlib.util.find_spec("matplotlib") is None:
        assert not png.exists()
    else:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_speedup_is_eager_median_over_candidate_median(
    quick_run: tuple[Path, dict[str, Any]],
) -> None:
    out, data = quick_run
    eager = {r["model"]: r["median_ms"] for r in data["rows"] if r["candidate"] == "eager"}
    assert set(eager) == set(MODELS)
    timed = [r for r in data["rows"] if r["status"] == "ok"]
    assert {r["candidate"] for r in timed} >= {"eager", "dynamo-eager"}
    for row in timed:
        assert row["median_ms"] > 0 and row["compile_s"] >= 0
        assert row["speedup"] == pytest.approx(eager[row["model"]] / row["median_ms"], rel=1e-9)
        assert row["max_abs_err"] < 1e-4
    with (out / "results.csv").open() as f:
        for row in csv.DictReader(f):
            if row["status"] == "ok":
                ratio = eager[row["model"]] / float(row["median_ms"])
                assert float(row["speedup"]) == pytest.approx(ratio, rel=1e-6)


def test_unavailable_backends_are_rows_with_their_reason(
    quick_run: tuple[Path, dict[str, Any]],
) -> None:
    _, data = quick_run
    never = [r for r in data["rows"] if r["candidate"] == "never"]
    assert [(r["status"], r["reason"]) for r in never] == [("unavailable", NEVER_REASON)] * 2
    assert all(r["median_ms"] is None and r["speedup"] is None for r in never)
    trt = [r for r in data["rows"] if r["candidate"] == "tensorrt"]
    if trt[0]["status"] == "ok":
        pytest.skip("tensorrt runs on this machine")
    assert all(r["status"] in ("unavailable", "not_registered") and r["reason"] for r in trt)


def test_chain_rows_count_graphs_and_name_winners(quick_run: tuple[Path, dict[str, Any]]) -> None:
    _, data = quick_run
    graphs = {"mlp": 1, "graph_break": 2}
    chains = [r for r in data["rows"] if r["kind"] == "chain"]
    assert len(chains) == 4
    for row in chains:
        assert row["status"] == "ok", row
        assert row["graphs"] == graphs[row["model"]]
        assert row["winners"] == ["eager"] * graphs[row["model"]]  # no tensorrt on CPU
        if "tensorrt" not in backends.registry:
            assert row["reason"] == "without tensorrt (not registered)"
    dynamo = [r for r in data["rows"] if r["candidate"] == "dynamo-eager"]
    assert [r["graphs"] for r in dynamo] == [1, 2]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--models", "resnet,nope"], "valid: resnet"),
        (["--backends", "inductr"], "valid: "),
        (["--chains", "onnxruntime,bogus"], "invalid chain backend: bogus"),
        (["--device", "tpu"], "choose from"),
        (["--dtype", "fp16"], "needs --device cuda"),
        (["--dtype", "int8"], "choose from"),
        (["--repeats", "0"], "must be >= 1"),
        (["--batch-size", "many"], "not an integer"),
        (["--modes", "slowest"], "valid: first, fastest"),
    ],
)
def test_bad_arguments_exit_2_with_the_valid_choices(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run.parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("name", default_models())
def test_suite_models_build_and_run(name: str) -> None:
    model, inputs = SUITE[name].build(2, torch.device("cpu"), torch.float32, tiny=True)
    with torch.no_grad():
        out = model(*inputs)
    leaves = out if isinstance(out, tuple) else (out,)
    assert all(t.shape[0] == 2 and torch.isfinite(t).all() for t in leaves)


def test_graph_break_model_hands_dynamo_two_graphs() -> None:
    model, inputs = SUITE["graph_break"].build(2, torch.device("cpu"), torch.float32, tiny=True)
    graphs: list[int] = []

    def counting(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        graphs.append(len(gm.graph.nodes))
        return gm.forward

    torch.compile(model, backend=counting)(*inputs)
    assert len(graphs) == 2


class Double(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def _failing_after(calls: int) -> Compiled:
    count = [0]

    def fn(x: torch.Tensor) -> torch.Tensor:
        count[0] += 1
        if count[0] > calls:
            raise RuntimeError("device lost\nsecond line")
        return x * 2

    return Compiled(fn)


def test_failures_become_rows_with_reasons() -> None:
    def unsupported(model: torch.nn.Module) -> Compiled:
        raise Unsupported("op foo is not supported")

    x = torch.ones(2)
    candidates = [
        Candidate("eager", "eager", lambda m: Compiled(m)),
        Candidate("refuses", "backend", unsupported),
        Candidate("dies", "backend", lambda m: _failing_after(1)),
        Candidate("wrong", "backend", lambda m: Compiled(lambda x: x * 3)),
    ]
    rows = {r.candidate: r for r in bench_model("m", Double(), (x,), candidates, Settings(2, 1))}
    assert (rows["refuses"].status, rows["refuses"].reason) == (
        "unsupported",
        "op foo is not supported",
    )
    assert (rows["dies"].status, rows["dies"].reason) == (
        "runtime_error",
        "RuntimeError: device lost",
    )
    assert rows["dies"].median_ms is None
    assert (rows["wrong"].status, rows["wrong"].max_abs_err) == ("mismatch", 1.0)
    assert "RMSE vs float64 1 is above eager's 0" in rows["wrong"].reason
    assert rows["wrong"].speedup is not None  # a wrong answer is still timed, for the record
    assert rows["eager"].speedup == 1.0


def test_one_line_peels_dynamo_wrappers() -> None:
    try:
        try:
            raise Unsupported("dynamic shapes", detail="long text")
        except Unsupported as inner:
            raise RuntimeError("backend='x' raised") from inner
    except RuntimeError as outer:
        assert failure(outer) == ("unsupported", "dynamic shapes")
    assert failure(ValueError("bad\nmore")) == ("compile_error", "ValueError: bad")


def test_geomeans_count_matching_rows_only() -> None:

    rows = [
        Result("a", "x", "backend", "ok", speedup=2.0),
        Result("b", "x", "backend", "ok", speedup=0.5),
        Result("c", "x", "backend", "mismatch", speedup=10.0),  # a wrong answer is no gain
    ]
    assert geomeans(rows)["x"] == (pytest.approx(1.0), 2)


def test_script_and_chain_bench_entry_points_reject_bad_input(
    capsys: pytest.CaptureFixture[str],
) -> None:
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "run.py"
    done = subprocess.run(
        [sys.executable, str(script), "--models", "nope"], capture_output=True, text=True
    )
    assert done.returncode == 2 and "invalid model: nope; valid: resnet" in done.stderr
    from chain.cli import main as chain_main

    with pytest.raises(SystemExit) as exit_info:
        chain_main(["bench", "--backends", "inductr"])
    assert exit_info.value.code == 2
    assert "invalid backend: inductr; valid:" in capsys.readouterr().err


def test_backend_options_reach_the_backend_and_threads_reach_onnxruntime() -> None:
    seen: list[dict[str, Any]] = []
    with backends.registry.snapshot() as reg:

        @reg.register("probe", options=["intra_op_num_threads"])
        def probe(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor], **opts: Any) -> Any:
            seen.append(opts)
            return gm.forward

        cand = backend_candidate("probe", {"probe": {"intra_op_num_threads": 1}})
        assert cand.make is not None
        cand.make(Double()).fn(torch.ones(2))
    assert seen == [{"intra_op_num_threads": 1}]
    assert thread_options(2) == {"onnxruntime": {"intra_op_num_threads": 2}}
    assert thread_options(None) == {}


def test_chart_draws_the_spread_titles_the_setup_and_lists_what_did_not_run() -> None:
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    rows = [
        Result("m", "eager", "eager", "ok", median_ms=1.0, iqr_ms=0.1, speedup=1.0),
        Result("m", "onnxruntime", "backend", "ok", median_ms=0.5, iqr_ms=0.1, speedup=2.0),
        Result("m", "tensorrt", "backend", "unavailable", "no CUDA device"),
    ]
    meta = {"device": "cpu", "dtype": "fp32", "threads": 2, "machine": "Linux x86_64"}
    fig = draw(meta, rows)
    (ax,) = fig.axes
    assert ax.get_title() == "speedup over eager (cpu fp32, 2 threads)\nLinux x86_64"
    (bars,) = [c for c in ax.containers if getattr(c, "errorbar", None) is not None]
    (segment,) = bars.errorbar.lines[2][0].get_segments()
    spread = 0.5 * 0.1 / 0.5 + 0.5 * 0.1 / 1.0  # candidate's and eager's, relative
    assert segment[:, 1] == pytest.approx([2.0 / (1 + spread), 2.0 * (1 + spread)])
    text = "\n".join(t.get_text() for t in fig.texts)
    assert "tensorrt: unavailable (no CUDA device)" in text
