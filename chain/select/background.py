"""The process's background work, one job at a time on one worker thread, off the
caller's: the artefact builds of kept decisions (`chain.select.deferred`: inductor's
AOTInductor package, a second compile of tens of seconds on a small CPU) and challengers
built in a child process (`chain.select.challenge`).

A job starts once no backend compile has run in the process, and dynamo has traced no
frame, for SETTLE_S seconds (a process that just compiled often compiles and times again:
dynamo's dynamic graph at the second shape, a bucket; a build beside that timing made its
decision noisy, so provisional, and its own package wasted), or at once when someone waits
for the jobs (`wait()`, the exit). Every outcome, failures included, is a note on the
graph's record (and the report file) and a line on the `chain` logger.

A process never waits silently or unboundedly for a job at exit: when one is queued or
running, it prints one line to stderr, waits at most CHAIN_EXIT_WAIT_S seconds (default
5; 0: no wait), and SIGINT ends the wait at once. A job unfinished by then is abandoned:
its child's process group is killed and its folder removed (`backends.cancel`), the graph's
note (and the report file) says so, and nothing is kept against it, so a later process
builds it again. A job past its child (loading, verifying, timing the artefact here) is
cancelled too: it stops at its next `cancel.checkpoint()`, and the exit waits for that, at
most LEAVE_S seconds, saying so. Leaving while the worker thread runs torch's kernels aborted
the process ("terminate called without an active exception", exit status 134).
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import queue
import sys
import threading
import time
from typing import Protocol

from backends import cancel
from backends.errors import one_line
from chain.judge.compiles import lineage, settle
from chain.select.records import Records

log = logging.getLogger("chain")


class Job(Protocol):
    """A background job for graph `record_id` of `records`: `run()` does it (after the
    process settled) and returns the graph's note; `failed(why)` is the note when it raised;
    `what` names it in the note of a job abandoned at exit."""

    @property
    def records(self) -> Records: ...

    @property
    def record_id(self) -> int: ...

    @property
    def what(self) -> str: ...

    def run(self) -> str: ...

    def failed(self, why: str) -> str: ...


LEAVE_S = 30.0  # at exit, the longest wait for a cancelled job to reach its next checkpoint

_queue: queue.Queue[Job] = queue.Queue()
_token = cancel.Token()  # the worker thread's: cancelled when the process leaves
_lock = threading.Lock()
_worker: threading.Thread | None = None
_current: list[Job] = []  # the job the worker runs now (for the note at exit)
_exit_hook: list[bool] = []
EXIT_WAIT_ENV = "CHAIN_EXIT_WAIT_S"
DEFAULT_EXIT_WAIT_S = 5.0
SETTLE_S = 5.0  # a build starts once the process has compiled nothing for this long
_hurry = threading.Event()  # set while someone waits for the builds: no settling
_waiters = [0]


def exit_wait_s() -> float:
    """How long a leaving process waits for its builds: CHAIN_EXIT_WAIT_S seconds (a
    number from 0 to 3600; anything else: the default, 5)."""
    try:
        value = float(os.environ.get(EXIT_WAIT_ENV, DEFAULT_EXIT_WAIT_S))
    except ValueError:
        return DEFAULT_EXIT_WAIT_S
    return value if math.isfinite(value) and 0 <= value <= 3600 else DEFAULT_EXIT_WAIT_S


def submit(build: Job) -> None:
    """Queue `build` (a package `Build`, or another `Job`); the worker thread starts if none
    runs."""
    global _worker
    with _lock:
        if cancel.abandoned():
            return  # the process is leaving: a later process builds it
        _queue.put(build)
        if not _exit_hook:
            atexit.register(at_exit)
            _exit_hook.append(True)
        if _worker is None:
            _worker = threading.Thread(target=_work, name="chain-artefacts", daemon=True)
            _worker.start()


def at_exit() -> None:
    """At exit: wait for the builds at most `exit_wait_s()`, saying so in one line; SIGINT
    ends the wait at once. Then abandon what still runs (its graph's note says so)."""
    with _lock:
        worker = _worker
    if worker is None or not worker.is_alive():
        cancel.abandon_children()  # none runs; a parked build's saved program is removed
        return
    bound = exit_wait_s()
    start = time.monotonic()
    if bound > 0:
        with _lock:
            _waiters[0] += 1  # the process is leaving: nothing is left to time
            _hurry.set()
        try:
            print(
                f"backend-chain: waiting up to {bound:g} s for a package build to finish "
                f"({EXIT_WAIT_ENV}; Ctrl-C skips it, a later process builds it)",
                file=sys.stderr,
                flush=True,
            )
            worker.join(bound)
        except KeyboardInterrupt:
            pass
    if not worker.is_alive():
        return
    abandoned = list(_current)
    with _lock:
        while not _queue.empty():
            abandoned.append(_queue.get_nowait())
    _token.cancel("the process is leaving")
    _hurry.set()  # a job still settling starts, and stops at its first checkpoint
    cancel.abandon_children()
    _stopped(worker)
    waited = time.monotonic() - start
    for build in abandoned:
        note = (
            f"{build.what} abandoned at exit after {waited:.1f} s ({EXIT_WAIT_ENV}={bound:g}); "
            "nothing kept against it: a later process builds it"
        )
        try:
            noted(build.records, build.record_id, note)
        except Exception as error:  # the report file may be gone at exit: logged, not lost
            log.warning("graph %d: %s (not noted: %s)", build.record_id, note, one_line(error))


def _stopped(worker: threading.Thread) -> None:
    """Wait for the cancelled worker to reach its next checkpoint (at most LEAVE_S, said
    after a moment): the interpreter must not end while it runs torch's kernels."""
    worker.join(0.5)
    if not worker.is_alive():
        return
    print(
        f"backend-chain: stopping the build's step in this process (at most {LEAVE_S:g} s; "
        "leaving during it would abort the process)",
        file=sys.stderr,
        flush=True,
    )
    worker.join(LEAVE_S)


def pending() -> bool:
    """Whether builds are queued or running (tests and benchmarks wait on `wait()`)."""
    with _lock:
        return _worker is not None


def wait(timeout_s: float | None = None) -> bool:
    """Wait for the queued builds to end; False if some still run after `timeout_s`."""
    with _lock:
        worker = _worker
        if worker is None:
            return True
        _waiters[0] += 1
        _hurry.set()
    try:
        worker.join(timeout_s)
    finally:
        with _lock:
            _waiters[0] -= 1
            if not _waiters[0]:
                _hurry.clear()
    return not worker.is_alive()


def _work() -> None:
    """Take builds until none is left, then end (the process may exit)."""
    global _worker
    while True:
        with _lock:
            try:
                build = _queue.get_nowait()
            except queue.Empty:
                _worker = None
                return
            _current[:] = [build]
        try:
            with cancel.holding(_token):
                _idle()
                cancel.checkpoint()  # no job starts once the process is leaving
                note = build.run()
        except cancel.Cancelled:
            return  # abandoned at exit: `at_exit` notes it, nothing is kept against it
        except Exception as error:  # every failure is the graph's note, never lost
            if cancel.abandoned():
                return
            log.warning("graph %d: %s failed", build.record_id, build.what, exc_info=True)
            note = build.failed(one_line(error))
        finally:
            _current.clear()
        if cancel.abandoned():
            return
        noted(build.records, build.record_id, note)


def _idle() -> None:
    """Wait until the process has compiled nothing for SETTLE_S (no selection in flight,
    none just made), or someone waits for the builds."""
    settle(SETTLE_S, lineage(), _hurry)


def noted(records: Records, record_id: int, note: str) -> None:
    """Add `note` to graph `record_id`'s record (and the report file); log it."""
    log.info("graph %d: %s", record_id, note)
    if record_id < len(records.report.graphs):
        records.note(record_id, note)
        records.save()
