"""Cooperative cancellation of abandoned work, and torch's process-wide tracing state.

A caller that stops waiting for a worker (the chain's `compile_timeout_s`) cancels the
worker's token; the worker stops at its next `checkpoint()`. Python cannot stop a thread
from outside, so what a backend does between checkpoints runs to its end.

Some work changes torch for every thread while it runs: torch.export and make_fx patch
`nn.Module.__call__` and set FX's "is tracing" flag, so a model called on another thread
meanwhile fails ("symbolically trace a dynamo-optimized function") or aborts the process.
Such work runs inside `process_wide()`: one section at a time, never entered by cancelled
work, and `settle()` waits for the section in flight, so a caller that abandons a worker
never runs user code beside it. Meanwhile `torch.compiler.is_exporting()` is true only on
the thread inside the section (`backends.exporting`).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

from backends.exporting import exporting_here

P = ParamSpec("P")
T = TypeVar("T")


class Cancelled(Exception):
    """The work was abandoned by its caller; raised at the worker's next checkpoint."""


class Token:
    """Whether the work of one worker thread (and the threads it hands work to) is abandoned."""

    def __init__(self) -> None:
        self.cancelled = False  # a plain attribute: cheap to read in a timing loop
        self.reason = ""

    def cancel(self, reason: str) -> None:
        self.reason = reason
        self.cancelled = True


_local = threading.local()
_SECTION = threading.RLock()


def current() -> Token | None:
    """The token of this thread's work (None: work nobody can abandon)."""
    return getattr(_local, "token", None)


@contextlib.contextmanager
def holding(token: Token | None) -> Iterator[None]:
    """Run this thread's work under `token` (restored on exit)."""
    previous = current()
    _local.token = token
    try:
        yield
    finally:
        _local.token = previous


def checkpoint() -> None:
    """Raise Cancelled when this thread's work was abandoned."""
    token = current()
    if token is not None and token.cancelled:
        raise Cancelled(token.reason or "abandoned by its caller")


def carried(fn: Callable[P, T]) -> Callable[P, T]:
    """`fn`, to run on another thread under this thread's token (a helper thread of a worker
    is abandoned with it)."""
    token = current()

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        with holding(token):
            return fn(*args, **kwargs)

    return run


@contextlib.contextmanager
def process_wide() -> Iterator[None]:
    """Mark work that changes torch for every thread (torch.export, make_fx): one at a time,
    none started by abandoned work, and "exporting" seen only by this thread."""
    with _SECTION, exporting_here():
        checkpoint()
        yield


def settle(timeout_s: float) -> bool:
    """Wait until no process-wide section is in flight; False if one still is after
    `timeout_s` (a trace that waits on the caller itself, such as dynamo's compile lock)."""
    if _SECTION.acquire(timeout=timeout_s):
        _SECTION.release()
        return True
    return False


# Children a backend runs (inductor's package builds): each registers how to stop it (its
# process group killed, its folder removed), so a process that leaves never waits on one
# nor leaves one behind (`abandon_children`, called at exit by chain.select.deferred).
_children_lock = threading.Lock()
_children: dict[int, Callable[[], None]] = {}
_abandoned = threading.Event()


@contextlib.contextmanager
def child(stop: Callable[[], None]) -> Iterator[None]:
    """Register `stop` (ends a child process, removes what it made) while the block runs;
    Cancelled at once if the process already abandoned its children."""
    if _abandoned.is_set():
        raise Cancelled("the process is leaving: no child is started")
    with _children_lock:
        _children[id(stop)] = stop
    try:
        yield
    finally:
        with _children_lock:
            _children.pop(id(stop), None)


def leftover(remove: Callable[[], None]) -> Callable[[], None]:
    """Register `remove` (deletes what waits for a child not started yet: a saved program
    in a private folder) to run if the process abandons its children; the function that
    releases it (the child ran, and its caller removed the folder). At once when the
    process already abandoned them."""
    with _children_lock:
        if not _abandoned.is_set():
            _children[id(remove)] = remove

            def release() -> None:
                with _children_lock:
                    _children.pop(id(remove), None)

            return release
    remove()
    return lambda: None


def abandon_children() -> int:
    """Stop every registered child now, and start none after (the process is leaving);
    how many were stopped."""
    _abandoned.set()
    with _children_lock:
        stops = list(_children.values())
        _children.clear()
    for stop in stops:
        stop()
    return len(stops)


def abandoned() -> bool:
    """Whether `abandon_children` ran: work still running was abandoned, not failed."""
    return _abandoned.is_set()
