"""Package builds cannot be hijacked or hold the exit (issue 44, items 3 and 4).

A build child runs `python -I` with the library found by one explicit path: a module
planted in the working directory (or on PYTHONPATH) never runs in it. It works in its own
folder, in its own process group, and dies with its parent, removing its folder. A process
whose build hangs (a real child that sleeps: CHAIN_TEST_BUILD_HANG) says so in one line,
waits at most CHAIN_EXIT_WAIT_S, SIGINT ends the wait at once, and no child or folder is
left; a later process builds again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from backends.errors import Unsupported
from backends.inductor.build import HANG_ENV, compile_in_child
from tests.helpers import ROOT, memory_env


def _gone(pid: int, within_s: float = 30.0) -> bool:
    """Whether process `pid` is gone (or a zombie nobody reaped yet) within `within_s`."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


def _wait_for(path: Path, within_s: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return json.loads(path.read_text())
        time.sleep(0.1)
    raise AssertionError(f"{path} never appeared: the build child did not start (or hang)")


def test_a_module_planted_in_the_working_directory_is_never_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planted = tmp_path / "cwd"
    planted.mkdir()
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    for name in ("json.py", "sitecustomize.py", "usercustomize.py", "torch.py"):
        (planted / name).write_text(code)
    monkeypatch.chdir(planted)
    monkeypatch.setenv("PYTHONPATH", str(planted))
    folder = tempfile.mkdtemp(prefix="chain-aoti-build-")  # no program: the child fails
    try:
        with pytest.raises(Unsupported, match="AOTInductor failed"):
            compile_in_child(folder, {})
    finally:
        os.rmdir(folder) if os.path.isdir(folder) and not os.listdir(folder) else None
    assert not marker.exists(), marker.read_text()


_PARENT = """
import sys, tempfile
from backends.inductor.build import compile_in_child
folder = tempfile.mkdtemp(prefix="chain-aoti-build-")
print(folder, flush=True)
compile_in_child(folder, {})
"""


def test_the_child_has_its_folder_and_group_and_dies_with_its_parent(tmp_path: Path) -> None:
    hang = tmp_path / "hang.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), HANG_ENV: str(hang)}
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT], env=env, stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        folder = parent.stdout.readline().strip() if parent.stdout else ""
        child = _wait_for(hang)
        assert child["folder"] == folder
        assert os.readlink(f"/proc/{child['pid']}/cwd") == folder
        assert os.getpgid(child["pid"]) == child["pid"] != os.getpgid(parent.pid)
    finally:
        parent.kill()  # SIGKILL: nothing of the parent runs after
        parent.wait()
    assert _gone(child["pid"]), "the build child outlived its parent"
    deadline = time.monotonic() + 30
    while os.path.exists(folder) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(folder), "the build folder outlived its process"


# Compiles an MLP whose graph inductor wins (store on), waits until its package build's
# child runs (it hangs: CHAIN_TEST_BUILD_HANG), then says its last line and ends.
# SIGINT's default restored first: a child of a background job (CI run with `&`) inherits
# it ignored, and Python then keeps it ignored; a terminal's Ctrl-C meets the default
_SCRIPT = """
import json, os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
import torch
from chain import chain
from tests.models import MLP

class Two(torch.nn.Module):  # two graphs: two package builds, the second queued
    def __init__(self):
        super().__init__()
        self.a, self.b = MLP(), MLP()

    def forward(self, x):
        y = self.a(x)
        torch._dynamo.graph_break()
        return self.b(y) * 2

model = (Two() if os.environ.get("TWO_GRAPHS") else MLP()).eval()
backend = chain("inductor", "eager", mode="first", eager_floor=False, memory=True)
fast = torch.compile(model, backend=backend)
with torch.no_grad():
    for batch in (4, 4):
        fast(torch.randn(batch, 32))
hang = os.environ.get("CHAIN_TEST_BUILD_HANG")
deadline = time.monotonic() + 300
while hang and not os.path.exists(hang) and time.monotonic() < deadline:
    time.sleep(0.05)
print("last line", flush=True)
"""


def _script(cache: Path, **env: str) -> subprocess.Popen[str]:
    environment = {
        **memory_env(cache),
        "CHAIN_INDUCTOR_PACKAGE": "1",
        **env,
    }
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_SCRIPT)],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def _last_line(process: subprocess.Popen[str]) -> float:
    """When the script said its last line (monotonic seconds)."""
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.strip() == "last line", (line, process.stderr.read() if process.stderr else "")
    return time.monotonic()


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("exit")


@pytest.mark.slow
def test_a_hung_build_holds_the_exit_at_most_the_bound_and_leaves_nothing(
    cache: Path, tmp_path: Path
) -> None:
    hang = tmp_path / "hang.json"
    process = _script(cache, **{HANG_ENV: str(hang), "CHAIN_EXIT_WAIT_S": "2"})
    said = _last_line(process)
    _, err = process.communicate(timeout=300)  # the old exit waited for the child's hour
    after = time.monotonic() - said
    print(f"hung build, CHAIN_EXIT_WAIT_S=2: {after:.2f} s from the last line to exit")
    assert process.returncode == 0, err[-2000:]
    waits = [ln for ln in err.splitlines() if "waiting up to 2 s for a package build" in ln]
    assert len(waits) == 1, err[-2000:]
    child = json.loads(hang.read_text())
    assert _gone(child["pid"]), "the build child outlived the process"
    assert not os.path.exists(child["folder"]), "the build folder outlived the process"
    assert after < 2 + 60  # the bound, and a busy machine's slack for the exit itself
    for entry in (cache / "decisions").glob("*.json"):  # nothing kept against the build
        assert "no_artefact" not in entry.read_text()


@pytest.mark.slow
def test_a_build_still_queued_at_exit_leaves_no_folder(tmp_path: Path) -> None:
    """Two graphs, two package builds: the first hangs in its child, the second waits in
    the queue with its exported program saved. Neither folder outlives the process."""
    hang, temp = tmp_path / "hang.json", tmp_path / "tmp"
    temp.mkdir()
    env = {HANG_ENV: str(hang), "CHAIN_EXIT_WAIT_S": "2", "TWO_GRAPHS": "1", "TMPDIR": str(temp)}
    process = _script(tmp_path / "store", **env)
    _last_line(process)
    _, err = process.communicate(timeout=300)
    assert process.returncode == 0, err[-2000:]
    child = json.loads(hang.read_text())
    assert _gone(child["pid"]), "the build child outlived the process"
    assert sorted(p.name for p in temp.glob("chain-aoti-build-*")) == []


@pytest.mark.slow
def test_sigint_ends_the_wait_at_once_and_a_later_process_builds_again(
    cache: Path, tmp_path: Path
) -> None:
    # the same store: a warm start with no package builds it again (it hangs again)
    hang = tmp_path / "hang.json"
    process = _script(cache, **{HANG_ENV: str(hang), "CHAIN_EXIT_WAIT_S": "600"})
    _last_line(process)
    assert process.stderr is not None
    line = process.stderr.readline()
    while line and "waiting up to" not in line:
        line = process.stderr.readline()
    assert "waiting up to 600 s" in line
    process.send_signal(signal.SIGINT)
    sent = time.monotonic()
    process.wait(timeout=120)
    after = time.monotonic() - sent
    print(f"SIGINT during the exit wait: {after:.2f} s to exit")
    child = json.loads(hang.read_text())
    assert _gone(child["pid"]) and not os.path.exists(child["folder"])
    assert after < 10  # at once: the interpreter's own teardown on a busy machine


@pytest.mark.slow
def test_the_exit_without_a_build(cache: Path) -> None:
    process = _script(cache, CHAIN_INDUCTOR_PACKAGE="0")
    said = _last_line(process)
    _, err = process.communicate(timeout=300)
    after = time.monotonic() - said
    print(f"no build: {after:.2f} s from the last line to exit")
    assert process.returncode == 0, err[-2000:]
    assert "waiting up to" not in err
