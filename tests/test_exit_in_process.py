"""A process that leaves while the chain's background worker runs torch's kernels in-process
(a challenger's package loaded, verified, warmed up; a kept decision's package timed against
the JIT compile) exits cleanly: the worker is cancelled, stops at its next checkpoint, and
the exit waits for that, saying so. Leaving during those kernels aborted the process
("terminate called without an active exception", exit status 134): the message was seen
once in 12 user-style runs with two CPU hogs, and a job like this test's aborted every time."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT

SCRIPT = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {root!r})
    import torch
    from backends import cancel
    from chain.judge.compiles import compiling
    from chain.select import background

    class Sink:  # where the job's note would go: a graph this process does not have
        class report:
            graphs = []

    class Verifying:  # the in-process part of a package job: kernels, a checkpoint each step
        records, record_id, what = Sink(), 0, "a package's verification in this process"

        def run(self):
            open({mark!r}, "w").write("started")
            a = torch.randn(384, 384)
            end = time.time() + 60
            while time.time() < end:
                cancel.checkpoint()
                a = torch.tanh(a @ a)
            return "verified"

        def failed(self, why):
            return why

    torch.set_num_threads(2)
    if {hurry}:
        background._hurry.set()  # no settling: the job starts now
    else:
        with compiling("a compile just ended"):  # the job waits SETTLE_S (5 s) to start
            pass
    background.submit(Verifying())
    time.sleep(1.0)
    print("leaving", flush=True)
    """
)


@pytest.mark.parametrize(
    ("state", "wait_s"),
    [("running", "0.5"), ("settling", "0")],  # its kernels in flight; not started yet
)
def test_leaving_while_the_worker_has_a_job_exits_cleanly(
    state: str, wait_s: str, tmp_path: Path
) -> None:
    mark = tmp_path / "started"
    code = SCRIPT.format(root=str(ROOT), mark=str(mark), hurry=state == "running")
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
        env={**os.environ, "CHAIN_EXIT_WAIT_S": wait_s},
    )  # fmt: skip
    took = time.monotonic() - start
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "terminate called" not in done.stderr
    assert done.stdout.strip() == "leaving"
    if state == "running":
        assert mark.exists()  # its kernels were in flight when the process left
        assert f"waiting up to {wait_s} s for a package build" in done.stderr
        assert took < 30, took  # it stopped at its next checkpoint, not at its end (60 s)
    else:
        assert not mark.exists()  # a job not started by the exit never starts
