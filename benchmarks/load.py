"""Load and fresh processes for the benchmarks and timing tests: CPU hogs that are always
reaped, and a fresh Python process whose last line of output is its JSON result.

A hog is a real process spinning on a core (as another job on a shared machine is), so the
chain sees the load in its own timings. `Hogs` kills and waits for every one it started on
`stop()`, on leaving its `with` block (an error, Ctrl-C) and at interpreter exit; a hog also
exits by itself once its parent is gone (a parent killed with SIGKILL leaves none behind).
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# spins on one core; every ~10M steps it checks that its parent is alive (an orphan stops)
HOG = """
import os, sys
parent = int(sys.argv[1])
while os.getppid() == parent:
    for _ in range(10_000_000):
        pass
"""


class Hogs:
    """`count` CPU-hog processes: started by `start()` (or entering the `with` block), killed
    and reaped by `stop()`, which is safe to call twice and also runs at exit."""

    def __init__(self, count: int) -> None:
        if count < 0:
            raise ValueError(f"hogs: a count of processes, not {count}")
        self.count = count
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> Hogs:
        """Start the hogs (none more if they run already)."""
        if not self.procs:
            atexit.register(self.stop)
            argv = [sys.executable, "-c", HOG, str(os.getpid())]
            for _ in range(self.count):
                self.procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL))
        return self

    @property
    def running(self) -> int:
        """How many of the started hogs are still alive."""
        return sum(proc.poll() is None for proc in self.procs)

    def stop(self) -> None:
        """Kill every hog and wait for it: none is left running or a zombie."""
        procs, self.procs = self.procs, []
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        for proc in procs:
            proc.wait(timeout=30)
        atexit.unregister(self.stop)

    def __enter__(self) -> Hogs:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()


def fresh_python(
    code: str,
    args: Sequence[str] = (),
    env: Mapping[str, str | None] | None = None,
    timeout_s: float = 1800,
) -> Any:
    """Run `code` in a fresh Python process (the repository on its path, `env` added to the
    environment, a None value removing its name); its last line of standard output, parsed
    as JSON. A failed process is a RuntimeError carrying the end of its standard error."""
    full = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name, value in (env or {}).items():
        if value is None:
            full.pop(name, None)
        else:
            full[name] = value
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(code)
    try:
        done = subprocess.run(
            [sys.executable, f.name, *args],
            capture_output=True,
            text=True,
            env=full,
            cwd=ROOT,
            timeout=timeout_s,
            check=False,
        )
    finally:
        os.unlink(f.name)
    if done.returncode != 0:
        raise RuntimeError(f"{list(args)}: exit {done.returncode}\n{done.stderr[-3000:]}")
    lines = done.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"{list(args)}: no output\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])
