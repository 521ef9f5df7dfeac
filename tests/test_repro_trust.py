"""`chain repro` on hostile reports (issue 32): report strings are data, never code; a
report this machine's chain did not write (its keyed tag, issue 44) needs --trust; hostile
--size specs are one line and write nothing; a backend defined in the user's script is
found again by its file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from chain import chain
from chain.report.look.repro import SCRIPT
from tests import faults
from tests.helpers import cli_runs

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "CHAIN_MEMORY": "0", "PYTHONPATH": str(ROOT)}


@pytest.fixture(autouse=True, scope="module")
def machine_key_folder(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The cache folder of the machine key that tags reports, the tests' own."""
    folder = str(tmp_path_factory.mktemp("cache"))
    ENV["CHAIN_CACHE_DIR"] = folder
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CHAIN_CACHE_DIR", folder)
        yield folder


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real report (a compile error, then eager) on a graph with a symbolic size."""
    torch._dynamo.reset()
    backend = chain(faults.raises_at_compile, "eager", measure=False)
    fn = torch.compile(lambda x: (x.sin() + 1) * x.shape[0], backend=backend, dynamic=True)
    fn(torch.randn(5))
    return backend.report.to_dict()


def _save(data: dict[str, Any], path: Path) -> Path:
    path.write_text(json.dumps(data))
    path.chmod(0o644)
    return path


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chain", *args], capture_output=True, text=True, cwd=ROOT, env=ENV
    )


def _run(script: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=ROOT, env=ENV
    )


def _renamed(data: dict[str, Any], old: str, new: str, reason: str) -> dict[str, Any]:
    """The report with backend `old` renamed `new` (no import path) and its reason."""
    data = json.loads(json.dumps(data))
    graph = data["graphs"][0]
    graph["sources"].pop(old, None)
    for attempt in graph["attempts"]:
        if attempt["backend"] == old:
            attempt["backend"], attempt["reason"] = new, reason
    return data


@pytest.mark.parametrize("form", ["expression", "lines"])
def test_backend_name_and_reason_are_data_never_code(
    form: str, recorded: dict[str, Any], tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    payload = f'__import__("pathlib").Path("{marker}").touch()'
    # an expression that closes the old docstring and runs when repro.py is imported
    name = f'x""" + str({payload}) + """' if form == "expression" else f'x"""\n{payload}\n"""'
    reason = f"boom'''\\\n{payload}\n\"\"\" {{0}} {{EXPECTED}}"
    report = _save(_renamed(recorded, "raises_at_compile", name, reason), tmp_path / "r.json")
    folder = tmp_path / "repro"
    done = _cli("repro", str(report), "0", name, "-o", str(folder), "--trust")
    assert done.returncode == 0, done.stderr
    assert (folder / "repro.py").read_text() == SCRIPT  # nothing of the report in the code
    expected = json.loads((folder / "expected.json").read_text())
    assert (expected["backend"], expected["reason"], expected["report"]) == (
        name, reason, str(report)
    )  # fmt: skip
    run = _run(folder / "repro.py")
    assert "InvalidBackend" in run.stderr  # the name is looked up as a name: no such backend
    assert not marker.exists()


def test_report_you_did_not_make_needs_trust(recorded: dict[str, Any], tmp_path: Path) -> None:
    # a downloaded report is a file you own, 0644: that proves nothing (issue 44)
    report = _save(recorded, tmp_path / "r.json")
    folder = tmp_path / "repro"
    done = _cli("repro", str(report), "0", "raises_at_compile", "-o", str(folder))
    assert done.returncode == 2 and not folder.exists()
    [line] = done.stderr.splitlines()
    assert "not written by the chain on this machine" in line and "pass --trust" in line
    done = _cli("repro", str(report), "0", "raises_at_compile", "-o", str(folder), "--trust")
    assert done.returncode == 0, done.stderr
    assert (folder / "repro.py").exists()


def test_a_report_the_chain_wrote_here_needs_no_trust_until_edited(
    recorded: dict[str, Any], tmp_path: Path
) -> None:
    from chain.report.report import Report

    report = Report.from_dict(recorded).save(tmp_path / "r.json")  # tagged with the key
    folder = tmp_path / "repro"
    done = _cli("repro", str(report), "0", "raises_at_compile", "-o", str(folder))
    assert done.returncode == 0, done.stderr
    data = json.loads(report.read_text())
    data["graphs"][0]["code"] = str(data["graphs"][0]["code"]) + "\n# edited"
    report.write_text(json.dumps(data))  # the tag stays, the content moved on
    done = _cli("repro", str(report), "0", "raises_at_compile", "-o", str(tmp_path / "x"))
    assert done.returncode == 2 and "edited since" in done.stderr, done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_report_owned_by_another_user_needs_trust(
    recorded: dict[str, Any], tmp_path: Path
) -> None:
    report = _save(recorded, tmp_path / "r.json")
    os.chown(report, 4242, 4242)
    folder = tmp_path / "repro"
    done = _cli("repro", str(report), "0", "raises_at_compile", "-o", str(folder))
    assert done.returncode == 2 and not folder.exists()
    [line] = done.stderr.splitlines()
    assert "pass --trust" in line


HOSTILE_SIZES = [
    "s77=²", "s77=٣", "s77=1e9", "=8", "s77=-1", "s77=", "s77", "s77=2147483648",
    "s\x1b[2J=3", "s77=8=9", "s77=2147483647",  # the last: a valid spec, inputs too big
]  # fmt: skip
HOSTILE_SPECS = [
    ("dtype", "load", "a recorded dtype that is not one"),
    ("shape", [-3], "a recorded size that is not one"),
    ("shape", "5", "a recorded shape that is not a list"),
    ("device", "nowhere:0", "a recorded device not usable here"),
    ("device", "cuda:7", "a recorded device not usable here"),
]


class Repro:
    """One `chain repro` of the batch below: the folder it was told to write, the run."""

    def __init__(self, folder: Path, done: subprocess.CompletedProcess[str]) -> None:
        self.folder, self.done = folder, done


@pytest.fixture(scope="module")
def hostile_repros(
    recorded: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> dict[Any, Repro]:
    """`chain repro` on the recorded report with each hostile `--size`, and on the report
    with each hostile input spec: all in one fresh process (tests/helpers.py cli_runs: one
    torch import, not sixteen), each command with a report and a target folder of its own."""
    argv: dict[Any, list[str]] = {}
    folders: dict[Any, Path] = {}
    for size in HOSTILE_SIZES:
        tmp = tmp_path_factory.mktemp("size")
        data = json.loads(json.dumps(recorded))
        data["graphs"][0]["inputs"][1]["shape"] = ["s77"]  # the tensor sized by the symbol
        report = _save(data, tmp / "r.json")
        folders[size] = tmp / "repro"
        argv[size] = ["repro", str(report), "0", "raises_at_compile", "-o", str(folders[size])]
        argv[size] += ["--size", size, "--trust"]
    for field, value, _ in HOSTILE_SPECS:
        tmp = tmp_path_factory.mktemp("spec")
        data = json.loads(json.dumps(recorded))
        data["graphs"][0]["inputs"][1][field] = value
        report = _save(data, tmp / "r.json")
        case = (field, json.dumps(value))
        folders[case] = tmp / "repro"
        argv[case] = ["repro", str(report), "0", "raises_at_compile", "-o", str(folders[case])]
        argv[case] += ["--trust"]
    done = cli_runs(*argv.values(), env=ENV)
    return {case: Repro(folders[case], run) for case, run in zip(argv, done, strict=True)}


@pytest.mark.parametrize("size", HOSTILE_SIZES)
def test_hostile_size_is_one_line_and_writes_nothing(
    size: str, hostile_repros: dict[Any, Repro]
) -> None:
    repro = hostile_repros[size]
    done = repro.done
    assert done.returncode == 2, done.stdout
    [line] = done.stderr.splitlines()
    assert line.startswith("chain: error: ") and "\x1b" not in line
    assert not repro.folder.exists()


@pytest.mark.parametrize(("field", "value", "message"), HOSTILE_SPECS)
def test_hostile_input_spec_is_one_line(
    field: str, value: Any, message: str, hostile_repros: dict[Any, Repro]
) -> None:
    repro = hostile_repros[field, json.dumps(value)]
    done = repro.done
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr  # one line, no traceback
    assert not repro.folder.exists()


USER_SCRIPT = """
import sys
import torch
from chain import chain


def my_backend(gm, example_inputs):
    raise RuntimeError("my_backend cannot compile this")


if __name__ == "__main__":
    backend = chain(my_backend, "eager", measure=False)
    torch.compile(lambda x: x.cos() * 2, backend=backend)(torch.randn(4))
    backend.report.save(sys.argv[1])
"""


def test_backend_defined_in_the_users_script_is_found_by_its_file(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(USER_SCRIPT))
    report = tmp_path / "run.json"
    made = _run_args(script, str(report))
    assert made.returncode == 0, made.stderr[-2000:]
    graph = json.loads(report.read_text())["graphs"][0]
    assert graph["sources"] == {"my_backend": f"{script}:my_backend"}
    folder = tmp_path / "repro"
    done = _cli("repro", str(report), "0", "my_backend", "-o", str(folder))
    assert done.returncode == 0, done.stderr
    run = _run(folder / "repro.py")
    assert run.returncode == 0, run.stdout + run.stderr[-2000:]
    assert "my_backend: compile_error: RuntimeError: my_backend cannot compile" in run.stdout
    assert "reproduced: compile_error" in run.stdout


def _run_args(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, cwd=ROOT, env=ENV
    )
