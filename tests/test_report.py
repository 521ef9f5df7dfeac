"""The report: JSON round trip, atomic saves, the CLI, and `backend="chain"`."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
from pathlib import Path

import pytest
import torch

from chain import Report, Status, chain, default_backends, last_chain
from tests import faults
from tests.clock import ROUNDS, VirtualClock
from tests.helpers import cli_runs, compile_and_check
from tests.models import build

REQUIRED_GRAPH_KEYS = {
    "id",
    "fingerprint",
    "origin",
    "num_nodes",
    "ops",
    "inputs",
    "winner",
    "attempts",
}
REQUIRED_ATTEMPT_KEYS = {
    "backend",
    "status",
    "reason",
    "compile_s",
    "latency_ms",
    "speedup",
    "max_abs_err",
}

STRING_SPEEDUP = json.dumps(
    {
        "version": 1,
        "graphs": [
            {"id": 0, "fingerprint": "f", "origin": "o", "num_nodes": 1, "ops": {}, "inputs": [],
             "winner": "eager",
             "attempts": [{"backend": "eager", "status": "won", "speedup": "1.2"}]}
        ],
    }
)  # fmt: skip


@pytest.fixture(scope="module")
def report() -> Report:
    torch._dynamo.reset()
    model, args = build("graph_break")
    backend = chain(faults.raises_at_compile, faults.declines, "eager")
    compile_and_check(model, args, backend, calls=1)
    return backend.report


ROOT = Path(__file__).resolve().parents[1]


def test_json_has_the_documented_keys(report: Report, tmp_path: Path) -> None:
    data = json.loads(report.save(tmp_path / "r.json").read_text())
    assert {"version", "graphs", "summary"} <= data.keys()
    assert len(data["graphs"]) == 2
    for graph in data["graphs"]:
        assert graph.keys() >= REQUIRED_GRAPH_KEYS
        assert [a["status"] for a in graph["attempts"]] == ["compile_error", "unsupported", "won"]
        for attempt in graph["attempts"]:
            assert attempt.keys() >= REQUIRED_ATTEMPT_KEYS
        assert "converter exploded" in graph["attempts"][0]["traceback"]
    assert data["summary"]["winners"] == {"eager": 2}


def test_round_trip_is_lossless(report: Report, tmp_path: Path) -> None:
    loaded = Report.load(report.save(tmp_path / "r.json"))
    assert loaded.graphs == report.graphs
    assert loaded.summary() == report.summary()
    assert loaded.graphs[0].attempts[1].status is Status.UNSUPPORTED


def test_summary_sums_eager_over_winners(report: Report) -> None:
    s = report.summary()
    holds = [g for g in report.graphs if not g.noisy]  # noisy graphs are summed apart
    eager = sum(g.eager_ms for g in holds)
    winners = sum(g.winning_attempt.latency_ms for g in holds)
    if not holds:
        assert s["speedup"] is None
        return
    assert s["speedup"] == pytest.approx(eager / winners, rel=1e-3)


def test_save_is_atomic(report: Report, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "r.json"
    target.write_text("old")

    def crash(*_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("os.replace", crash)
    with pytest.raises(OSError, match="disk full"):
        report.save(target)
    assert target.read_text() == "old"
    assert list(tmp_path.iterdir()) == [target]  # no temporary file left behind


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_save_writes_with_the_umask(report: Report, tmp_path: Path, umask: int, mode: int) -> None:
    old = os.umask(umask)
    try:
        path = report.save(tmp_path / "r.json")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == mode


def test_save_says_when_it_creates_a_directory(
    report: Report, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = tmp_path / "new" / "deeper" / "r.json"
    with caplog.at_level(logging.WARNING, logger="chain"):
        report.save(target)
        report.save(target)  # the directory exists now: nothing more to say
    created = [r.getMessage() for r in caplog.records if "created" in r.getMessage()]
    assert created == [f"Report.save: created the missing directory {target.parent}"]
    assert Report.load(target).graphs == report.graphs


def test_table_and_markdown_show_every_attempt(report: Report) -> None:
    text = str(report)
    md = report.to_markdown()
    for needle in ("raises_at_compile", "compile_error", "unsupported", "exploded", "frobnicate"):
        assert needle in text and needle in md
    assert report.summary_line() in md
    failures = report.to_markdown(failures_only=True)
    assert "| won |" not in failures and "compile_error" in failures


BAD_FILES = [
    ('{"version": 1, "graphs": [{"id": 0', "not valid JSON (truncated?)"),
    ('{"hello": 1}', "not a backend-chain report"),
    ('{"version": 1, "graphs": [{"id": 0}]}', "malformed graph record: KeyError"),
    ('{"version": 99, "graphs": []}', "report version 99"),
    (STRING_SPEEDUP, "attempt 'eager': speedup should be a number or null, got '1.2'"),
]
PRINTS = {
    "table": [],
    "markdown": ["--format", "markdown", "--failures"],
    "csv": ["--format", "csv", "--failures"],
    "json": ["--format", "json"],
}


@pytest.fixture(scope="module")
def cli(
    report: Report, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[Path, subprocess.CompletedProcess[str]]]:
    """`chain report` on the saved report in each form, on each bad file and on a missing
    one: all in one fresh process (tests/helpers.py cli_runs: one torch import, not ten);
    each command's file and run, by form, bad file's content, or "missing"."""
    folder = tmp_path_factory.mktemp("cli")
    path = report.save(folder / "r.json")
    files = {form: path for form in PRINTS}
    argv = {form: ["report", str(path), *flags] for form, flags in PRINTS.items()}
    for i, (content, _) in enumerate(BAD_FILES):
        files[content] = folder / str(i) / "bad.json"
        files[content].parent.mkdir()
        files[content].write_text(content)
        argv[content] = ["report", str(files[content])]
    files["missing"] = folder / "nope.json"
    argv["missing"] = ["report", str(files["missing"])]
    done = cli_runs(*argv.values(), env={**os.environ, "PYTHONPATH": str(ROOT)})
    return {case: (files[case], run) for case, run in zip(argv, done, strict=True)}


def test_cli_prints_the_saved_report(
    report: Report, cli: dict[str, tuple[Path, subprocess.CompletedProcess[str]]]
) -> None:
    table = cli["table"][1]
    assert table.returncode == 0, table.stderr
    assert "declines" in table.stdout and "exploded" in table.stdout
    md = cli["markdown"][1]
    assert md.returncode == 0 and "| won |" not in md.stdout and "unsupported" in md.stdout
    rows = cli["csv"][1].stdout.splitlines()
    assert rows[0].startswith("graph,backend,status,compile s,") and len(rows) == 5
    assert all(",won," not in r for r in rows) and "no converter" in rows[2]
    js = cli["json"][1]
    assert Report.from_dict(json.loads(js.stdout)).graphs == report.graphs


@pytest.mark.parametrize(("content", "message"), BAD_FILES)
def test_cli_rejects_bad_files_in_one_line(
    cli: dict[str, tuple[Path, subprocess.CompletedProcess[str]]], content: str, message: str
) -> None:
    path, result = cli[content]
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert str(path) in result.stderr and message in result.stderr


def test_cli_missing_file(cli: dict[str, tuple[Path, subprocess.CompletedProcess[str]]]) -> None:
    result = cli["missing"][1]
    assert result.returncode == 2 and "no such file" in result.stderr


def test_report_path_is_rewritten_after_every_graph(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "live.json"
    monkeypatch.setenv("CHAIN_REPORT", str(path))
    model, args = build("graph_break")
    backend = chain("eager")
    seen: list[int] = []
    original = backend.records.finish

    def spy(*a: object, **k: object) -> object:
        out = original(*a, **k)
        seen.append(len(json.loads(path.read_text())["graphs"]))
        return out

    monkeypatch.setattr(backend.records, "finish", spy)
    compile_and_check(model, args, backend, calls=1)
    assert seen == [1, 2]


def test_torch_compile_backend_chain_by_name() -> None:
    model, args = build("mlp")
    compile_and_check(model, args, "chain")
    used = last_chain()
    assert used is not None
    graph = used.report.graphs[-1]
    assert [a.backend for a in graph.attempts] == list(default_backends())
    assert default_backends()[-1] == "eager"
    # on a machine without CUDA the GPU backends are unavailable, with their reasons
    if not torch.cuda.is_available():
        statuses = {a.backend: a.status for a in graph.attempts}
        assert statuses["tensorrt"] is Status.UNAVAILABLE
        # onnxruntime passes; it runs the graph unless measurably slower than eager (the floor)
        assert graph.winner in ("onnxruntime", "eager")
        assert statuses["onnxruntime"] in (Status.WON, Status.SLOWER)


def test_torch_compile_chain_options_pick_the_chain() -> None:
    model, args = build("mlp")
    with torch.no_grad():
        compiled = torch.compile(
            model,
            backend="chain",
            # without the floor the outcome does not hang on the timings: the first passes
            options={"backends": ["inductor", "eager"], "mode": "first", "eager_floor": False},
        )
        torch.testing.assert_close(compiled(*args), model(*args))
    graph = last_chain().report.graphs[-1]
    assert [(a.backend, a.status) for a in graph.attempts] == [
        ("inductor", Status.WON),
        ("eager", Status.NOT_TRIED),
    ]


def test_torch_compile_chain_rejects_unknown_options() -> None:
    model, args = build("mlp")
    with pytest.raises(Exception, match="unknown chain option"):
        torch.compile(model, backend="chain", options={"colour": "blue"})(*args)


def test_table_prints_brackets_literally() -> None:
    from chain.report.records import Attempt, GraphRecord

    record = GraphRecord(
        id=0,
        fingerprint="f",
        origin="o",
        num_nodes=1,
        ops={},
        inputs=[],
        winner=None,
        attempts=(Attempt("tensorrt", Status.UNAVAILABLE, "pip install 'backend-chain[gpu]'"),),
    )
    assert "pip install 'backend-chain[gpu]'" in Report([record]).render(width=200)


def test_error_and_spread_fields_round_trip_and_version_1_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, args = build("mlp")
    clock = VirtualClock().install(monkeypatch, ROUNDS)  # slower, whatever the load
    # a mismatch, a slower, the floor
    backend = chain(faults.perturbed, faults.Sleeps(sleep=clock.sleep))
    with torch.inference_mode():
        compile_and_check(model, args, backend, calls=1)
    wrong, slow, floor = backend.report.graphs[0].attempts
    assert (floor.backend, floor.status) == ("eager", Status.WON)
    assert wrong.error is not None and wrong.eager_error is not None
    assert wrong.error_ratio == pytest.approx(wrong.error / wrong.eager_error)
    assert slow.spread_ms is not None and backend.report.graphs[0].eager_spread_ms is not None
    path = backend.report.save(tmp_path / "r.json")
    assert Report.load(path).graphs == backend.report.graphs
    rendered = backend.report.render(width=200)
    assert f"{wrong.error_ratio:.2f}" in rendered and "measurably slower" in rendered

    data = json.loads(path.read_text())
    data["version"] = 1  # as written before these fields existed
    for graph in data["graphs"]:
        graph.pop("eager_spread_ms")
        for attempt in graph["attempts"]:
            for key in ("error", "eager_error", "error_ratio", "spread_ms"):
                attempt.pop(key)
    (tmp_path / "v1.json").write_text(json.dumps(data))
    [old] = Report.load(tmp_path / "v1.json").graphs
    assert [a.status for a in old.attempts] == [a.status for a in backend.report.graphs[0].attempts]
    assert old.attempts[0].error is None and old.eager_spread_ms is None
