"""`python -m chain repro`: the repro of a rejection reproduces it in a fresh process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from chain import Report, Status, chain
from chain.bench import zoo
from chain.report.look.repro import ReproError, example_input, write
from tests import faults
from tests.helpers import cli_runs

ROOT = Path(__file__).parent.parent
pytestmark = pytest.mark.skipif(zoo.available() is not None, reason=str(zoo.available()))


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BERT at two shapes through three failing backends and eager, saved."""
    torch._dynamo.reset()
    backend = chain(
        faults.wrong_numbers, faults.raises_at_compile, faults.raises_at_run, "eager",
        measure=False,
    )  # fmt: skip
    model = torch.compile(zoo.build("bert"), backend=backend)
    with torch.no_grad():
        for shape in (0, 1):
            model(*zoo.inputs("bert", shape))
    return backend.report.save(tmp_path_factory.mktemp("repro") / "run.json")


def test_the_record_keeps_code_sources_and_size_hints(saved: Path) -> None:
    report = Report.load(saved)
    [symbol] = [s for s in report.graphs[1].inputs if s.get("type") == "SymInt"]
    assert symbol["hint"] == zoo.TEXT_SHAPES[1][1]  # the sequence length of that call
    graph = report.graphs[0]
    assert graph.code is not None and "class Repro(torch.nn.Module)" in graph.code
    assert graph.sources["wrong_numbers"] == "tests.faults:wrong_numbers"
    assert "eager" not in graph.sources  # built in: found by name


REPROS = [
    (0, "wrong_numbers", Status.MISMATCH),
    (0, "raises_at_compile", Status.COMPILE_ERROR),
    (0, "raises_at_run", Status.RUNTIME_ERROR),
    (1, "wrong_numbers", Status.MISMATCH),  # the dynamic graph: sizes as recorded
]


@pytest.fixture(scope="module")
def written(
    saved: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[tuple[int, str], tuple[Path, subprocess.CompletedProcess[str]]]:
    """`chain repro` for each case of REPROS and for a backend the report does not have
    (0, "nope"), all in one fresh process (tests/helpers.py cli_runs: one torch import, not
    five): each case's folder and the command's run. Each repro then runs in a fresh
    process of its own."""
    cases = [(g, b) for g, b, _ in REPROS] + [(0, "nope")]
    folders = {case: tmp_path_factory.mktemp("repro") / "repro" for case in cases}
    argv = [["repro", str(saved), str(g), b, "-o", str(f)] for (g, b), f in folders.items()]
    done = cli_runs(*argv)
    return {case: (folders[case], run) for case, run in zip(folders, done, strict=True)}


@pytest.mark.parametrize(("graph", "backend", "status"), REPROS)
def test_repro_reproduces_in_a_fresh_process(
    saved: Path,
    written: dict[tuple[int, str], tuple[Path, subprocess.CompletedProcess[str]]],
    graph: int,
    backend: str,
    status: Status,
) -> None:
    recorded = next(a for a in Report.load(saved).graphs[graph].attempts if a.backend == backend)
    assert recorded.status is status
    folder, done = written[graph, backend]
    assert done.returncode == 0, done.stderr
    assert {p.name for p in folder.iterdir()} >= {"repro.py", "graph.py", "inputs.pt"}
    run = subprocess.run(
        [sys.executable, str(folder / "repro.py")], capture_output=True, text=True, cwd=ROOT
    )
    assert run.returncode == 0, run.stdout + run.stderr[-2000:]
    assert f"{backend}: {status.value}: " in run.stdout
    first_line = recorded.reason.splitlines()[0]
    assert first_line.split(":")[0] in run.stdout  # the same kind of reason
    assert f"reproduced: {status.value}" in run.stdout
    assert json.loads((folder / "expected.json").read_text())["status"] == status.value


def test_repro_fails_when_the_status_does_not_come_back(saved: Path, tmp_path: Path) -> None:
    """The check can fail: a recorded mismatch rerun with a correct backend is not one."""
    folder = tmp_path / "repro"
    write(Report.load(saved), 0, "wrong_numbers", folder)
    expected = json.loads((folder / "expected.json").read_text())
    expected["source"] = None
    expected["backend"] = "eager"
    (folder / "expected.json").write_text(json.dumps(expected))
    run = subprocess.run(
        [sys.executable, str(folder / "repro.py")], capture_output=True, text=True, cwd=ROOT
    )
    assert run.returncode == 1, run.stdout + run.stderr[-2000:]
    assert "eager: won" in run.stdout and "not reproduced: recorded mismatch" in run.stdout


def test_repro_errors_name_what_is_wrong(
    saved: Path,
    written: dict[tuple[int, str], tuple[Path, subprocess.CompletedProcess[str]]],
    tmp_path: Path,
) -> None:
    report = Report.load(saved)
    with pytest.raises(ReproError, match="no graph 9"):
        write(report, 9, "eager", tmp_path)
    with pytest.raises(ReproError, match="no attempt of 'inductor'"):
        write(report, 0, "inductor", tmp_path)
    with pytest.raises(ReproError, match="symbolic size 's9'"):
        example_input({"type": "SymInt", "value": "s9"}, {}, 0)
    _, done = written[0, "nope"]  # the command line says so too
    assert done.returncode == 2 and "no attempt of 'nope'" in done.stderr
