"""The AOTInductor compile of a saved program, in an isolated child process.

The child reads `FOLDER/program.pt2` (written by this user's own process,
`backends.inductor.package.prepare`) and `FOLDER/configs.json`, and writes
`FOLDER/graph.pt2`. In a child, AOTInductor's process-wide config patches and tracing never
meet the user's threads, and its Python work holds another GIL. Isolated: `python -I` (no
working-directory, script-folder, PYTHON* or user-site imports) finds this library by one
explicit `sys.path` entry computed from this module's location; it runs with its private
build folder as working directory, in a session (process group) of its own, and dies with
its parent: it watches a pipe whose write end only the parent holds (and, on Linux, asks for
SIGTERM when the parent dies); either way it removes its folder and kills its process group
(the compilers it runs). The parent registers how to stop it (`backends.cancel.child`), so a
process that leaves abandons it at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from backends import cancel
from backends.common.files import read_bounded
from backends.errors import Unsupported

MAX_BYTES = 2 << 30  # a package without weights is megabytes
TIMEOUT_S = 3600.0  # the longest a child may compile
HANG_ENV = "CHAIN_TEST_BUILD_HANG"  # tests: a file the child writes its pid to, then hangs
ROOT = str(Path(__file__).resolve().parents[2])  # where `backends` is importable
# the child's whole program: the library from ROOT only, then `child_main`
_BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from backends.inductor.build import child_main; child_main(*sys.argv[2:])"
)


def _kill_group(process: subprocess.Popen[Any]) -> None:
    """SIGKILL the child's process group (it and the compilers it runs)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def compile_in_child(folder: str, configs: Mapping[str, Any]) -> bytes:
    """The package's bytes, compiled by an isolated child Python in `folder`; Unsupported
    with the child's last line when it fails, Cancelled when the process abandoned it."""
    Path(folder, "configs.json").write_text(json.dumps(dict(configs)))
    watch_read, watch_write = os.pipe()  # EOF in the child: the parent is gone
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    try:
        process = subprocess.Popen(
            [sys.executable, "-I", "-c", _BOOT, ROOT, folder, str(watch_read), str(os.getpid())],
            cwd=folder,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            pass_fds=(watch_read,),
        )
    finally:
        os.close(watch_read)

    def stop() -> None:
        _kill_group(process)
        shutil.rmtree(folder, ignore_errors=True)

    try:
        with cancel.child(stop):
            try:
                _, err = process.communicate(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                stop()
                process.communicate()
                raise Unsupported(f"AOTInductor did not finish in {TIMEOUT_S:.0f} s") from None
    finally:
        os.close(watch_write)
        if process.poll() is None:  # an exception left it running: never left behind
            _kill_group(process)
            process.wait()
    if cancel.abandoned():
        raise cancel.Cancelled("the package build was abandoned: the process is leaving")
    if process.returncode != 0:
        lines = [ln for ln in err.strip().splitlines() if ln.strip()]
        last = lines[-1][:300] if lines else f"exit status {process.returncode}"
        raise Unsupported(f"AOTInductor failed: {last}")
    return read_bounded(Path(folder, "graph.pt2"), MAX_BYTES)


def _die_with_parent(folder: str, watch_fd: int, parent: int) -> None:
    """In the child: when the parent is gone (its pipe reads EOF, or SIGTERM from the
    kernel's parent-death signal), remove the build folder and kill this process group."""

    def leave(*_: Any) -> None:
        shutil.rmtree(folder, ignore_errors=True)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    signal.signal(signal.SIGTERM, leave)
    if sys.platform == "linux":
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before the signal was asked for
        leave()

    def watch() -> None:
        while os.read(watch_fd, 1):
            pass
        leave()

    threading.Thread(target=watch, name="chain-parent-watch", daemon=True).start()


def child_main(folder: str, watch_fd: str, parent: str) -> None:
    """The child's entry (`_BOOT`): tied to its parent, then the compile."""
    _die_with_parent(folder, int(watch_fd), int(parent))
    hang = os.environ.get(HANG_ENV)
    if hang:  # a compiler that never returns, for the tests of the process's exit
        Path(hang).write_text(json.dumps({"pid": os.getpid(), "folder": os.getcwd()}))
        time.sleep(TIMEOUT_S)
    main(folder)


def main(folder: str) -> None:
    import torch
    from torch._inductor import aoti_compile_and_package

    configs = json.loads(Path(folder, "configs.json").read_text())
    program = torch.export.load(os.path.join(folder, "program.pt2"))
    with torch.no_grad():
        aoti_compile_and_package(
            program, package_path=os.path.join(folder, "graph.pt2"), inductor_configs=configs
        )
