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


FORMS = ("expression", "lines")
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


def _injection(form: str, tmp: Path) -> tuple[Path, str, str]:
    """A marker file, and a backend name and reason that would touch it if a repro ran them
    as code: an expression that closes the old docstring, or lines of their own."""
    marker = tmp / "ran"
    payload = f'__import__("pathlib").Path("{marker}").touch()'
    name = f'x""" + str({payload}) + """' if form == "expression" else f'x"""\n{payload}\n"""'
    reason = f"boom'''\\\n{payload}\n\"\"\" {{0}} {{EXPECTED}}"
    return marker, name, reason


@pytest.fixture(scope="module")
def user_report(machine_key_folder: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The user's own script (a backend it defines, then eager) run once: its exit and the
    report it saved."""
    tmp = tmp_path_factory.mktemp("user")
    script = tmp / "train.py"
    script.write_text(textwrap.dedent(USER_SCRIPT))
    report = tmp / "run.json"
    return script, report, _run_args(script, str(report))


@pytest.fixture(scope="module")
def repros(
    recorded: dict[str, Any], user_report: Any, tmp_path_factory: pytest.TempPathFactory
) -> dict[Any, Any]:
    """Every single `chain repro` of the tests below (hostile names, reports not made here,
    edited, another user's, hostile `--size`s and input specs, the user's backend), all in
    one fresh process (tests/helpers.py cli_runs: one torch import, not two dozen), each
    command with a report and a target folder of its own."""
    from chain.report.report import Report

    argv: dict[Any, list[str]] = {}
    cases: dict[Any, Any] = {}

    def repro(case: Any, report: Path, backend: str, folder: Path, *more: str) -> None:
        argv[case] = ["repro", str(report), "0", backend, "-o", str(folder), *more]
        cases[case] = folder

    for form in FORMS:
        tmp = tmp_path_factory.mktemp(form)
        marker, name, reason = _injection(form, tmp)
        renamed = _renamed(recorded, "raises_at_compile", name, reason)
        report = _save(renamed, tmp / "r.json")
        repro(form, report, name, tmp / "repro", "--trust")
        cases[form] = (tmp / "repro", marker, name, reason, report)
    tmp = tmp_path_factory.mktemp("untrusted")
    report = _save(recorded, tmp / "r.json")  # a downloaded report: a file you own, 0644
    repro("untrusted", report, "raises_at_compile", tmp / "refused")
    repro("trusted", report, "raises_at_compile", tmp / "repro", "--trust")
    tmp = tmp_path_factory.mktemp("tagged")
    report = Report.from_dict(recorded).save(tmp / "r.json")  # tagged with the key
    repro("tagged", report, "raises_at_compile", tmp / "repro")
    data = json.loads(report.read_text())
    data["graphs"][0]["code"] = str(data["graphs"][0]["code"]) + "\n# edited"
    (tmp / "edited").mkdir()
    edited = tmp / "edited" / "r.json"
    edited.write_text(json.dumps(data))  # the tag stays, the content moved on
    repro("edited", edited, "raises_at_compile", tmp / "x")
    if os.geteuid() == 0:  # giving a file to another user needs root
        tmp = tmp_path_factory.mktemp("owned")
        report = _save(recorded, tmp / "r.json")
        os.chown(report, 4242, 4242)
        repro("another_user", report, "raises_at_compile", tmp / "repro")
    for size in HOSTILE_SIZES:
        tmp = tmp_path_factory.mktemp("size")
        data = json.loads(json.dumps(recorded))
        data["graphs"][0]["inputs"][1]["shape"] = ["s77"]  # the tensor sized by the symbol
        report = _save(data, tmp / "r.json")
        repro(size, report, "raises_at_compile", tmp / "repro", "--size", size, "--trust")
    for field, value, _ in HOSTILE_SPECS:
        tmp = tmp_path_factory.mktemp("spec")
        data = json.loads(json.dumps(recorded))
        data["graphs"][0]["inputs"][1][field] = value
        report = _save(data, tmp / "r.json")
        repro((field, json.dumps(value)), report, "raises_at_compile", tmp / "repro", "--trust")
    _, user, made = user_report
    if made.returncode == 0:  # else its test fails on the script's own exit
        repro("user", user, "my_backend", user.parent / "repro")
    done = cli_runs(*argv.values(), env=ENV)
    return {case: (cases[case], run) for case, run in zip(argv, done, strict=True)}


@pytest.mark.parametrize("form", FORMS)
def test_backend_name_and_reason_are_data_never_code(form: str, repros: dict[Any, Any]) -> None:
    (folder, marker, name, reason, report), done = repros[form]
    assert done.returncode == 0, done.stderr
    assert (folder / "repro.py").read_text() == SCRIPT  # nothing of the report in the code
    expected = json.loads((folder / "expected.json").read_text())
    assert (expected["backend"], expected["reason"], expected["report"]) == (
        name, reason, str(report)
    )  # fmt: skip
    run = _run(folder / "repro.py")
    assert "InvalidBackend" in run.stderr  # the name is looked up as a name: no such backend
    assert not marker.exists()


def test_report_you_did_not_make_needs_trust(repros: dict[Any, Any]) -> None:
    # a downloaded report is a file you own, 0644: that proves nothing (issue 44)
    folder, done = repros["untrusted"]
    assert done.returncode == 2 and not folder.exists()
    [line] = done.stderr.splitlines()
    assert "not written by the chain on this machine" in line and "pass --trust" in line
    folder, done = repros["trusted"]  # the same report
    assert done.returncode == 0, done.stderr
    assert (folder / "repro.py").exists()


def test_a_report_the_chain_wrote_here_needs_no_trust_until_edited(
    repros: dict[Any, Any],
) -> None:
    _, done = repros["tagged"]
    assert done.returncode == 0, done.stderr
    _, done = repros["edited"]  # the same report, its code edited after it was tagged
    assert done.returncode == 2 and "edited since" in done.stderr, done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_report_owned_by_another_user_needs_trust(repros: dict[Any, Any]) -> None:
    folder, done = repros["another_user"]
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


@pytest.mark.parametrize("size", HOSTILE_SIZES)
def test_hostile_size_is_one_line_and_writes_nothing(size: str, repros: dict[Any, Any]) -> None:
    folder, done = repros[size]
    assert done.returncode == 2, done.stdout
    [line] = done.stderr.splitlines()
    assert line.startswith("chain: error: ") and "\x1b" not in line
    assert not folder.exists()


@pytest.mark.parametrize(("field", "value", "message"), HOSTILE_SPECS)
def test_hostile_input_spec_is_one_line(
    field: str, value: Any, message: str, repros: dict[Any, Any]
) -> None:
    folder, done = repros[field, json.dumps(value)]
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr  # one line, no traceback
    assert not folder.exists()


def test_backend_defined_in_the_users_script_is_found_by_its_file(
    user_report: Any, repros: dict[Any, Any]
) -> None:
    script, report, made = user_report
    assert made.returncode == 0, made.stderr[-2000:]
    graph = json.loads(report.read_text())["graphs"][0]
    assert graph["sources"] == {"my_backend": f"{script}:my_backend"}
    folder, done = repros["user"]
    assert done.returncode == 0, done.stderr
    run = _run(folder / "repro.py")
    assert run.returncode == 0, run.stdout + run.stderr[-2000:]
    assert "my_backend: compile_error: RuntimeError: my_backend cannot compile" in run.stdout
    assert "reproduced: compile_error" in run.stdout


def _run_args(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, cwd=ROOT, env=ENV
    )
