"""Backend compiles in flight in this process: a timing run beside one measures the compile
(it holds the GIL and the cores), so timing waits for them and records those that ran."""

from __future__ import annotations

import contextlib
import itertools
import sys
import threading
import time
from collections.abc import Iterator

_running: dict[int, str] = {}  # compile id -> backend name
_ended = [float("-inf")]  # time.monotonic() when the last compile ended
_ids = itertools.count(1)
_changed = threading.Condition()
_local = threading.local()


@contextlib.contextmanager
def compiling(name: str, enclosing: tuple[int, ...] = ()) -> Iterator[None]:
    """Mark a backend's compile in flight on this thread until it ends (abandoned or not):
    a compile beside a timing run holds the GIL and the cores (seen: eager timed at 464 ms
    a call, ~1 ms alone). `enclosing`: the compiles this one runs inside (`lineage()` of
    the thread that started it), which a timing run inside it does not wait for."""
    ident = next(_ids)
    with _changed:
        _running[ident] = name
    previous = getattr(_local, "lineage", ())
    _local.lineage = (*enclosing, ident)
    try:
        yield
    finally:
        _local.lineage = previous
        with _changed:
            del _running[ident]
            _ended[0] = time.monotonic()
            _changed.notify_all()


def lineage() -> tuple[int, ...]:
    """The compiles this thread runs inside (a chain used as another chain's backend)."""
    return getattr(_local, "lineage", ())


def compiles_running(mine: tuple[int, ...] = ()) -> list[str]:
    """The backends compiling now in this process, but those in `mine`."""
    with _changed:
        return [name for ident, name in _running.items() if ident not in mine]


def quiet(timeout_s: float, mine: tuple[int, ...] = ()) -> list[str]:
    """Wait up to `timeout_s` for other compiles to end; those still running."""
    deadline = time.monotonic() + timeout_s
    with _changed:
        while others := [n for i, n in _running.items() if i not in mine]:
            left = deadline - time.monotonic()
            if left <= 0:
                return others
            _changed.wait(left)
    return []


def settle(
    seconds: float, mine: tuple[int, ...] = (), until: threading.Event | None = None
) -> None:
    """Wait until no compile (but those in `mine`) runs and, unless `until` is set, none
    has ended for `seconds`: a process that just compiled often compiles again (dynamo's
    dynamic graph at the second shape, a bucket), and times its candidates then. Dynamo
    tracing a frame on another thread counts as a compile: its tracing comes before any
    backend's (seconds for a transformers model on a busy machine)."""
    busy_seen = float("-inf")
    with _changed:
        while True:
            if any(i not in mine for i in _running):
                _changed.wait(0.5)
                continue
            if dynamo_compiling():
                busy_seen = time.monotonic()
                _changed.wait(0.1)
                continue
            left = max(_ended[0], busy_seen) + seconds - time.monotonic()
            if left <= 0 or (until is not None and until.is_set()):
                return
            _changed.wait(min(left, 0.5))  # `until` is looked at twice a second


def dynamo_compiling() -> bool:
    """Whether dynamo compiles a frame on another thread now: it holds its compile lock
    from tracing to guards (torch._dynamo.convert_frame's, a private name: False where
    torch has none)."""
    lock = getattr(sys.modules.get("torch._dynamo.convert_frame"), "compile_lock", None)
    if lock is None:
        return False
    if lock.acquire(blocking=False):  # free (or this thread's own): released at once
        lock.release()
        return False
    return True
