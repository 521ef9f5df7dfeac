"""The busy-machine benchmark's pure parts (benchmarks/busy.py, benchmarks/load.py): its
arguments, the hog processes (started, and reaped however the benchmark ends), when a
served timeline counts as settled on the fastest, the targets, and the JSON and markdown it
writes. No timings: the figures here are synthetic."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks import busy
from benchmarks.load import ROOT, Hogs, fresh_python


def gone(pid: int) -> bool:
    """The process has ended (absent, or a zombie its new parent has yet to reap)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def wait_gone(pids: list[int], limit_s: float = 120) -> bool:
    """Whether every pid ends within `limit_s` (generous: the machine may be busy)."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if all(gone(p) for p in pids):
            return True
        time.sleep(0.2)
    return False


def test_quick_fills_the_defaults_and_explicit_options_win() -> None:
    args = busy.parse(["--quick", "--hogs", "1", "--out", "x"])
    assert args.models == ["bert"] and args.chains == ["first"]
    assert args.hogs == [1] and args.calls_loaded == busy.QUICK["calls_loaded"]
    assert busy.parse(["--quick"]).hogs == [2]  # the load
    full = busy.parse([])
    assert full.models == list(busy.MODELS) and full.hogs == [0, 1, 2]
    assert full.calls_loaded + full.calls_quiet >= 2000  # the "after 2000 calls"


@pytest.mark.parametrize(
    "argv",
    [
        ["--hogs", "-1"],
        ["--hogs", "17"],
        ["--calls-quiet", "0"],
        ["--sample-every", "0"],
        ["--retime-s", "0"],
        ["--models", "resnet"],
        ["--chains", "fastest"],
    ],
)
def test_bad_arguments_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        busy.parse(argv)
    assert exit_.value.code == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.parametrize("count", [1, 2])
def test_hogs_run_and_are_reaped_on_stop(count: int) -> None:
    hogs = Hogs(count).start()
    procs = list(hogs.procs)
    assert len(procs) == count and hogs.running == count
    hogs.stop()
    hogs.stop()  # twice is harmless
    assert all(p.returncode is not None for p in procs)  # waited for: no zombie left
    assert hogs.running == 0


@pytest.mark.parametrize("error", [RuntimeError("a cell failed"), KeyboardInterrupt()])
def test_hogs_are_reaped_when_the_block_raises(error: BaseException) -> None:
    procs: list[subprocess.Popen[bytes]] = []
    with pytest.raises(type(error)), Hogs(2) as hogs:
        procs = list(hogs.procs)
        raise error
    assert len(procs) == 2 and all(p.returncode is not None for p in procs)


def _child_with_hogs(tail: str) -> tuple[subprocess.Popen[str], list[int]]:
    """A process that starts two hogs, prints their pids, then runs `tail`."""
    # a child of a background job inherits SIGINT ignored, and Python then keeps it
    # ignored: restore the default a terminal's Ctrl-C meets
    code = (
        "import json, signal, sys, time\nfrom benchmarks.load import Hogs\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "hogs = Hogs(2).start()\n"
        "print(json.dumps([p.pid for p in hogs.procs]), flush=True)\n" + tail
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT
    )
    assert proc.stdout is not None
    return proc, json.loads(proc.stdout.readline())


@pytest.mark.parametrize(
    ("tail", "end"),
    [
        ("sys.exit(0)\n", None),  # an exit without stop(): reaped at exit
        ("raise SystemExit('failed')\n", None),
        ("time.sleep(600)\n", signal.SIGINT),  # Ctrl-C
        ("time.sleep(600)\n", signal.SIGKILL),  # killed outright: the orphans stop themselves
    ],
)
def test_no_hog_outlives_the_process_that_started_it(tail: str, end: signal.Signals | None) -> None:
    proc, pids = _child_with_hogs(tail)
    assert len(pids) == 2
    if end is not None:
        assert not any(gone(p) for p in pids)
        proc.send_signal(end)
    proc.wait(timeout=120)
    assert wait_gone(pids), [p for p in pids if not gone(p)]


def test_fresh_python_returns_the_last_line_and_says_why_it_failed() -> None:
    code = "import os, json\nprint('noise')\nprint(json.dumps([os.getenv('A'), os.getenv('B')]))"
    os.environ["B"] = "set"
    try:
        assert fresh_python(code, env={"A": "1", "B": None}) == ["1", None]
    finally:
        del os.environ["B"]
    with pytest.raises(RuntimeError, match="boom"):
        fresh_python("raise ValueError('boom')")


def test_settled_counts_calls_after_the_load_until_served_by_a_fast_backend_for_good() -> None:
    good = {"onnxruntime"}
    changes = [{"call": 1, "servers": ["inductor"], "s": None},
               {"call": 700, "servers": ["onnxruntime"], "s": 0.4}]  # fmt: skip
    assert busy.settled(changes, good, loaded=500, total=2000) == (200, 0.4)
    assert busy.settled(changes[:1], good, loaded=500, total=2000) == (None, None)  # never
    early = [{"call": 1, "servers": ["onnxruntime"], "s": None}]
    assert busy.settled(early, good, loaded=500, total=2000) == (0, 0.0)  # before the load ended
    flap = [
        *changes,
        {"call": 900, "servers": ["eager"], "s": 0.5},
        {"call": 1200, "servers": ["onnxruntime"], "s": 16.2},  # a child's build joined late
    ]
    assert busy.settled(flap, good, loaded=500, total=2000) == (700, 16.2)  # for good counts
    assert busy.settled(flap, good, loaded=500, total=1000) == (None, None)  # past the end
    two = [{"call": 1, "servers": ["onnxruntime", "inductor"], "s": None}]
    assert busy.settled(two, good, loaded=500, total=2000) == (None, None)  # every graph must be


def _cell(model: str, hogs: int, servers: list[str], wrong: int = 0) -> dict[str, Any]:
    """A synthetic cell: a serving run whose server changed at call 800 (load off at 500)."""
    spec = {"model": model, "chain": "first", "hogs": hogs}
    return {
        "spec": spec,
        "eager_first_s": 2.0,
        "chain_first_s": 6.0,
        "servers": [
            {"call": 1, "servers": ["inductor"], "s": None},
            {"call": 800, "servers": servers, "s": 1.5},
        ],
        "wrong": [{"call": 50, "servers": servers, "error": 1.0}] * wrong,
        "checked": 40,
        "retime": {
            "ms": {"chain": 2.5, "onnxruntime": 2.47, "inductor": 3.46, "eager": 3.58},
            "noisy": ["7 other threads runnable on 2 CPUs while timed"] if hogs else [],
        },
        "warm": {"chain": {"first_s": 2.5}, "eager": {"first_s": 2.0}},
    }


def test_figures_and_targets_from_a_synthetic_run(tmp_path: Path) -> None:
    cells = [_cell("bert", 2, ["onnxruntime"]), _cell("gpt2", 0, ["inductor"], wrong=1)]
    for c in cells:
        c["figures"] = busy.derive(c, loaded=500, quiet=1500)
    fig = cells[0]["figures"]
    assert fig["fastest"] == "onnxruntime" and fig["within_5pct"] == ["onnxruntime"]
    assert fig["calls_to_fastest"] == 300 and fig["first_x_eager"] == pytest.approx(3.0)
    assert fig["seconds_to_fastest"] == 1.5
    assert fig["steady_x_fastest"] == pytest.approx(2.5 / 2.47)
    assert fig["server_x_eager"] == pytest.approx(2.47 / 3.58)
    assert fig["warm_x_eager"] == pytest.approx(1.25)
    assert cells[1]["figures"]["calls_to_fastest"] is None
    held = {t["target"]: t["held"] for t in busy.targets(cells, total_calls=2000)}
    assert list(held.values()) == [True, True, True, False, True]  # gpt2 gave a wrong answer
    short = busy.targets(cells, total_calls=1000)
    assert short[-1]["held"] is None  # fewer than 2000 calls: not measured
    result = {"date": "today", "command": "busy", "uptime_start": "load 2", "uptime_end": "load 3",
              "cells": cells, "targets": busy.targets(cells, 2000)}  # fmt: skip
    json_path, md_path = busy.write(tmp_path / "out", result)
    assert json.loads(json_path.read_text())["cells"][0]["figures"]["fastest"] == "onnxruntime"
    md = md_path.read_text()
    row = "| bert | first | 2 | 2.00 | 6.00 | 3.0 | onnxruntime | onnxruntime | 300 (1.5 s) |"
    assert row in md
    assert "| gpt2 | first | 0 |" in md and "| never |" in md and "1 / 40" in md
    assert "no answer wrong (sampled calls, against eager): **MISSED**" in md
    assert "load 2" in md and "load 3" in md
    assert "| 0 / 40 | noisy |" in md and "| 1 / 40 | ok |" in md
