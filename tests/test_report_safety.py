"""The report never hurts the model, keeps every chain's graphs and the file's mode, and the
CLI reads hostile files with one line (exit 2) and prints no terminal escapes."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from backends.common.files import UnsafeFile
from chain import Chain, Report, Status, chain
from chain.report.records import Attempt, GraphRecord
from tests.helpers import cli_runs
from tests.models import tiny_bert

ROOT = Path(__file__).resolve().parents[1]
SHAPES = ((2, 8), (3, 12))  # two shapes: the second call recompiles (a second graph)


def _run_bert(backend: Chain) -> None:
    """A tiny transformers BERT through `backend` at two shapes, each checked against eager."""
    model, _ = tiny_bert()
    model.eval()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for shape in SHAPES:
            ids = torch.randint(0, 100, shape)
            expected = model(ids).last_hidden_state
            torch.testing.assert_close(compiled(ids).last_hidden_state, expected)


def _quick(**kwargs: Any) -> Chain:
    return chain("eager", measure=False, **kwargs)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == "chain" and r.levelname == "WARNING"
    ]


# -- writing the report ---------------------------------------------------------------------


@pytest.mark.parametrize("where", ["a directory", "under a regular file"])
def test_an_unwritable_report_path_is_a_warning_not_a_failed_call(
    where: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if where == "a directory":
        path = tmp_path / "reports"
        path.mkdir()
    else:
        (tmp_path / "plain").write_text("a file, not a folder")
        path = tmp_path / "plain" / "run.json"
    backend = _quick(report_path=path)
    with caplog.at_level(logging.WARNING, logger="chain"):
        _run_bert(backend)  # the model runs, right, on both shapes
    assert len(backend.report.graphs) == 2
    assert all(g.winner == "eager" for g in backend.report.graphs)
    warned = _warnings(caplog)
    assert warned and all(str(path) in w and "report not written" in w for w in warned)


def test_a_read_only_folder_is_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes into a 0500 folder: the directory and file cases cover it")
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        backend = _quick(report_path=folder / "run.json")
        with caplog.at_level(logging.WARNING, logger="chain"):
            _run_bert(backend)
    finally:
        folder.chmod(0o700)
    assert len(backend.report.graphs) == 2
    assert any("report not written" in w for w in _warnings(caplog))


def _decision(graph: GraphRecord) -> tuple[Any, ...]:
    return graph.id, graph.fingerprint, graph.winner, graph.attempts


def test_two_chains_with_chain_report_keep_both_chains_graphs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("CHAIN_REPORT", str(tmp_path / "run.json"))
    first, second = _quick(), _quick()
    with caplog.at_level(logging.INFO, logger="chain"):
        _run_bert(first)
        _run_bert(second)
    files = [tmp_path / "run.json", tmp_path / "run.2.json"]  # the first chain's, then ours
    assert sorted(tmp_path.glob("run*.json")) == sorted(files)
    saved = [[_decision(g) for g in Report.load(f).graphs] for f in files]
    # the files hold what was decided at compile time (run-time counters come later)
    assert saved == [[_decision(g) for g in c.report.graphs] for c in (first, second)]
    # the second chain may get one dynamic graph: dynamo remembers the frame's two shapes
    assert len(saved[0]) == 2 and len(saved[1]) >= 1
    # the second chain says where its report went
    assert any(str(files[1]) in r.getMessage() for r in caplog.records if r.name == "chain")


def _one_graph_report() -> Report:
    record = GraphRecord(
        id=0,
        fingerprint="f",
        origin="o",
        num_nodes=1,
        ops={},
        inputs=[],
        winner="eager",
        attempts=(Attempt("eager", Status.WON, "ran"),),
    )
    return Report([record])


def test_save_keeps_an_existing_files_mode(tmp_path: Path) -> None:
    path = tmp_path / "private.json"
    path.write_text("{}")
    path.chmod(0o600)
    _one_graph_report().save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert Report.load(path).graphs == _one_graph_report().graphs


def test_save_refuses_a_symlink_and_leaves_its_target(tmp_path: Path) -> None:
    """Issue 32: a write never goes through a link (it once replaced the link's target)."""
    target = tmp_path / "store" / "run.json"
    target.parent.mkdir()
    target.write_text("{}")
    target.chmod(0o640)
    link = tmp_path / "run.json"
    link.symlink_to(target)
    with pytest.raises(UnsafeFile, match=r"not a regular file \(a symbolic link\)"):
        _one_graph_report().save(link)
    assert link.is_symlink() and os.readlink(link) == str(target)  # the link stays a link
    assert target.read_text() == "{}" and stat.S_IMODE(target.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json", "store"]  # no temporary


# -- reading hostile files --------------------------------------------------------------------


def _cli_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "CHAIN_REPORT"}


def _graph(**changes: Any) -> dict[str, Any]:
    graph = _one_graph_report().to_dict()["graphs"][0]
    graph.update(changes)
    return graph


def _report_text(*graphs: dict[str, Any]) -> str:
    return json.dumps({"version": 2, "graphs": list(graphs)})


HOSTILE = {
    "infinite id": _report_text(_graph()).replace('"id": 0', '"id": Infinity'),
    "nan nodes": _report_text(_graph()).replace('"num_nodes": 1', '"num_nodes": NaN'),
    "deep nesting": "[" * 100_000 + "]" * 100_000,
    "deep graphs": '{"version": 2, "graphs": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "winner is a list": _report_text(_graph(winner=["eager"])),
    "reason is a list": _report_text(
        _graph(attempts=[{"backend": "eager", "status": "won", "reason": ["x"]}])
    ),
    "graphs is a dict": '{"version": 2, "graphs": {"id": 0}}',
    "attempt is a list": _report_text(_graph(attempts=[[1, 2]])),
    "notes is a number": _report_text(_graph(notes=5)),
    "ops is a list": _report_text(_graph(ops=[1])),
}


HOSTILE_CASES = [(name, "table") for name in HOSTILE] + [
    ("winner is a list", form) for form in ("markdown", "csv", "json")
]


Runs = dict[tuple[str, str], tuple[Path, subprocess.CompletedProcess[str]]]


@pytest.fixture(scope="module")
def report_runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """`chain report FILE --format FORM` on each hostile file and on the report full of
    terminal escapes, and plain `chain report FILE` on a 4 GiB file and on a FIFO nobody
    writes, all in one fresh process (tests/helpers.py cli_runs: one torch import, not
    eighteen; a read that blocks fails every run there, by its hang guard): each case's
    file and what the command did."""
    folder = tmp_path_factory.mktemp("reports")
    texts = {case: HOSTILE[case[0]] for case in HOSTILE_CASES}
    texts |= {("escapes", form): _escapes_text() for form in ESCAPE_FORMS}
    paths = {}
    for i, (case, text) in enumerate(texts.items()):
        paths[case] = folder / str(i) / "report.json"
        paths[case].parent.mkdir()
        paths[case].write_text(text)
    argv = [["report", str(paths[case]), "--format", case[1]] for case in texts]
    paths["huge", ""] = folder / "huge.json"
    with paths["huge", ""].open("wb") as f:
        f.truncate(4 << 30)  # 4 GiB, sparse: nothing is written to the disk
    paths["fifo", ""] = folder / "pipe.json"
    os.mkfifo(paths["fifo", ""])  # nobody ever writes: reading it would block forever
    argv += [["report", str(paths["huge", ""])], ["report", str(paths["fifo", ""])]]
    done = cli_runs(*argv, env=_cli_env())
    return {case: (paths[case], run) for case, run in zip(paths, done, strict=True)}


@pytest.mark.parametrize(("name", "form"), HOSTILE_CASES)
def test_a_hostile_file_is_one_line_and_exit_2(
    name: str,
    form: str,
    report_runs: Runs,
) -> None:
    path, done = report_runs[name, form]
    assert done.returncode == 2, (done.stdout[-500:], done.stderr[-2000:])
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"chain: error: {path}: "), lines[:5]
    assert len(lines[0]) < 400, lines[0]


def test_a_huge_file_is_refused_without_reading_it(report_runs: Runs) -> None:
    path, done = report_runs["huge", ""]
    assert done.returncode == 2
    assert done.stderr.startswith(f"chain: error: {path}: ") and "MiB" in done.stderr
    assert len(done.stderr.splitlines()) == 1


def test_a_fifo_is_refused_not_waited_on(report_runs: Runs) -> None:
    fifo, done = report_runs["fifo", ""]
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"chain: error: {fifo}: not a regular file (a FIFO)"]


ESCAPES = "\x1b[31mred\x1b[0m \x1b]0;title\x07 \x9b2J back\rspace \u202egnp.exe"


ESCAPE_FORMS = ("table", "markdown", "csv")


def _escapes_text() -> str:
    """A report whose names, notes and reasons hold terminal escapes."""
    graph = _graph(
        winner="eager\x1b[2J",
        notes=["note \x1b[5m"],
        attempts=[{"backend": "eager\x1b[1m", "status": "won", "reason": ESCAPES}],
    )
    return _report_text(graph)


@pytest.mark.parametrize("form", ESCAPE_FORMS)
def test_terminal_escapes_in_a_report_are_neutralized(form: str, report_runs: Runs) -> None:
    path, done = report_runs["escapes", form]
    assert done.returncode == 0, done.stderr
    for bad in ("\x1b", "\x07", "\x9b", "\r", "\u202e"):
        assert bad not in done.stdout, (bad, done.stdout)
    assert "\\x1b[31mred" in done.stdout  # shown, harmlessly, as text
    assert "\\x1b[31mred" in Report.load(path).render(width=400)  # str(report) too


# -- bounds on options ------------------------------------------------------------------------


CORES = os.cpu_count() or 1


@pytest.mark.parametrize(
    ("kwargs", "needles"),
    [
        (
            {"options": {"onnxruntime": {"intra_op_num_threads": 10**6}}},
            ["intra_op_num_threads=1000000", f"<= {4 * CORES}", f"{CORES} cores"],
        ),
        (
            {"options": {"inductor": {"compile_threads": 10**6}}},
            ["compile_threads=1000000", f"<= {4 * CORES}"],
        ),
        ({"options": {"inductor": {"cpp.threads": 10**6}}}, ["cpp.threads=1000000", "-1"]),
        ({"compile_timeout_s": float("inf")}, ["compile_timeout_s=inf", "<= 86400"]),
        ({"measure_budget_s": float("inf")}, ["measure_budget_s=inf", "<= 3600"]),
        ({"measure_budget_s": 10**9}, ["measure_budget_s=1000000000", "<= 3600"]),
        ({"max_retries": 10**9}, ["max_retries=1000000000", "<= 10"]),
        ({"min_speedup": float("inf")}, ["min_speedup=inf", "<= 1000"]),
        ({"tolerances": {"float32": (float("inf"), 0.0)}}, ["(rtol, atol)", "rtol from 0 to 1"]),
    ],
)
def test_out_of_range_options_fail_at_chain_time(
    kwargs: dict[str, Any], needles: list[str]
) -> None:
    from backends.errors import InvalidOption

    with pytest.raises(InvalidOption) as info:
        chain("inductor", "onnxruntime", "eager", **kwargs)
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message


@pytest.mark.parametrize(
    ("option", "value", "needle"),
    [
        ("workspace_size", 1 << 60, "<= 1099511627776"),
        ("min_block_size", 10**9, "<= 100000"),
        ("optimization_level", 6, "<= 5"),
    ],
)
def test_tensorrt_options_are_bounded(option: str, value: int, needle: str) -> None:
    from backends.errors import InvalidOption

    with pytest.raises(InvalidOption, match=f"{option}={value}.*{needle}"):
        chain("tensorrt", "eager", options={"tensorrt": {option: value}})


def test_options_at_their_bounds_are_accepted() -> None:
    backend = chain(
        "inductor",
        "onnxruntime",
        "eager",
        options={
            "onnxruntime": {"intra_op_num_threads": 4 * CORES},
            "inductor": {"compile_threads": 1, "cpp.threads": -1},
        },
        compile_timeout_s=86400,
        measure_budget_s=3600,
        max_retries=10,
        min_speedup=1000,
    )
    assert backend.options["onnxruntime"] == {"intra_op_num_threads": 4 * CORES}


def test_every_chain_and_declared_backend_option_refuses_huge_and_infinite_values() -> None:
    """A guard for options added later: each one's check has an upper bound (or a type)."""
    from backends.errors import InvalidOption
    from backends.options import BadValue
    from backends.registry import registry
    from chain.select.options import CHAIN_OPTIONS

    for value in (10**15, float("inf")):
        for name, check in CHAIN_OPTIONS.items():
            with pytest.raises(BadValue):
                check(value)
                pytest.fail(f"chain option {name} accepts {value}")
        for backend in map(registry.lookup, ("onnxruntime", "tensorrt")):
            for name in backend.options or ():
                with pytest.raises(InvalidOption, match=name):
                    backend.check_options({name: value})


@pytest.mark.parametrize(
    ("flag", "value", "needle"),
    [
        ("--threads", 10**6, f"<= {4 * CORES}"),
        ("--repeats", 10**9, "<= 10000"),
        ("--warmup", 10**9, "<= 1000"),
        ("--batch-size", 10**9, "<= 4096"),
    ],
)
def test_bench_flags_are_bounded(
    flag: str, value: int, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from chain.bench.run import build_parser

    with pytest.raises(SystemExit) as info:
        build_parser().parse_args([flag, str(value)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and needle in err and str(value) in err


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def test_non_finite_figures_are_written_as_standard_json(tmp_path: Path) -> None:
    """Before: a NaN error ratio or an infinite timing was written as the bare NaN /
    Infinity, which is not JSON (`json.dumps(..., allow_nan=False)` raised, and strict
    readers such as browsers' JSON.parse refuse the file)."""
    from tests import faults

    backend = chain(faults.returns_nan, "eager", measure=False, eager_floor=False)
    _run_bert(backend)
    attempt = Attempt(
        "x", Status.MISMATCH, "NaN", error=float("nan"), error_ratio=float("inf"),
        latency_ms=float("-inf"), details={"ratio": [float("nan")]},
    )  # fmt: skip
    graph = backend.report.graphs[0]
    graph = GraphRecord(**{**graph.__dict__, "attempts": (*graph.attempts, attempt)})
    report = Report([graph, *backend.report.graphs[1:]])
    json.dumps(report.to_dict(), allow_nan=False)
    text = report.save(tmp_path / "report.json").read_text()
    data = json.loads(text, parse_constant=_refuse_constant)
    written = data["graphs"][0]["attempts"][-1]
    assert (written["error"], written["error_ratio"], written["latency_ms"]) == (
        "NaN", "Infinity", "-Infinity",
    )  # fmt: skip
    assert written["details"] == {"ratio": ["NaN"]}
    back = Report.load(tmp_path / "report.json").graphs[0].attempts[-1]
    assert back.error != back.error and back.error_ratio == float("inf")
    assert back.latency_ms == float("-inf")
    nan_attempt = backend.report.graphs[0].attempts[0]
    assert nan_attempt.status is Status.MISMATCH, nan_attempt
