"""Helpers: run a model through a backend and check it against eager; run code in a
fresh process (a warm start is a new process)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode


def compile_and_check(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    backend: Any,
    *,
    calls: int = 2,
    rtol: float = 1e-4,
    atol: float = 1e-5,
) -> Any:
    """torch.compile `model` with `backend`, call it `calls` times, assert it matches eager."""
    with torch.no_grad():
        expected = model(*args)
        compiled = torch.compile(model, backend=backend)
        for _ in range(calls):
            actual = compiled(*args)
            for e, a in zip(pytree.tree_leaves(expected), pytree.tree_leaves(actual), strict=True):
                torch.testing.assert_close(a, e, rtol=rtol, atol=atol)
    return actual


ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port nothing listens on now (the OS's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def memory_env(cache: Path) -> dict[str, str]:
    """A fresh process's environment with the decision store on, in `cache` (no Redis, no
    signing key from the caller's environment)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CHAIN_MEMORY": "1",
        "CHAIN_CACHE_DIR": str(cache),
    }
    env.pop("CHAIN_STORE", None)
    env.pop("CHAIN_MEMORY_KEY", None)
    return env


def fresh_process(
    code: str, *argv: str, env: dict[str, str] | None = None, timeout: float = 600
) -> Any:
    """Run `code` in a new Python with `argv`; assert it exited 0; its last line, as JSON.
    A child still running after `timeout` s gets SIGABRT (faulthandler on: it prints every
    thread's stack) and the test fails with that stack, not a bare timeout."""
    env = {**(env if env is not None else {**os.environ, "PYTHONPATH": str(ROOT)})}
    env["PYTHONFAULTHANDLER"] = "1"
    with subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    ) as child:
        try:
            out, err = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGABRT)
            out, err = child.communicate(timeout=30)
            raise AssertionError(f"hung for {timeout:.0f} s; its stacks:\n{err[-6000:]}") from None
    assert child.returncode == 0, f"exit status {child.returncode}: {err[-3000:]}"
    return json.loads(out.strip().splitlines()[-1])


_CLI_RUNS = """
import contextlib, io, json, runpy, sys, traceback

runs = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    sys.argv = ["chain", *argv]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_module("chain", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # what `python -m chain` would print before exiting 1
            traceback.print_exc()
            code = 1
    runs.append([code, out.getvalue(), err.getvalue()])
print(json.dumps(runs))
"""


def cli_runs(
    *runs: list[str], env: dict[str, str] | None = None, timeout: float = 600
) -> list[subprocess.CompletedProcess[str]]:
    """`python -m chain ARGS` for each of `runs`, one after another in ONE fresh process
    (each as `python -m chain` runs it: chain/__main__.py, its exit status, its stdout and
    stderr apart): the CLI tests pay one interpreter and torch import, not one per command.
    A command that hangs fails every run here (the timeout is a hang guard)."""
    done = subprocess.run(
        [sys.executable, "-c", _CLI_RUNS, json.dumps([list(r) for r in runs])],
        env=env if env is not None else {**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    assert done.returncode == 0, f"exit status {done.returncode}: {done.stderr[-3000:]}"
    results = json.loads(done.stdout.strip().splitlines()[-1])
    return [
        subprocess.CompletedProcess(["chain", *r], code, out, err)
        for r, (code, out, err) in zip(runs, results, strict=True)
    ]


class Seen(TorchDispatchMode):
    """Records the ops dispatched under it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[Any] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


def in_threads(fn: Callable[[], None], count: int = 4) -> None:
    """Run `fn` on `count` threads at once; the first thread's failure is raised here."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # the thread's failure, raised below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def count_numpy_runs(monkeypatch: Any, calls: list[int]) -> None:
    """Append to `calls` at each session run through the ORT runner's numpy entry
    (`numpy_parts`, chain/deploy/numpy_call.py) of modules built after."""
    from backends.onnxruntime.deploy import _CpuRun

    original = _CpuRun.numpy_parts

    def parts(self: Any) -> tuple[Any, list[str], tuple[str, ...]]:
        run, names, feeds = original(self)

        def counted(*args: Any) -> Any:
            calls.append(1)
            return run(*args)

        return counted, names, feeds

    monkeypatch.setattr(_CpuRun, "numpy_parts", parts)
