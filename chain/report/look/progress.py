"""Say what a long compile is doing: after AFTER_S seconds, a rich status line on a
terminal, a log line on the `chain` logger otherwise. Short work says nothing, and
neither do tests or CI (no terminal there) unless the `chain` logger is turned up."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("chain")

AFTER_S = 2.0  # work shorter than this says nothing


def _terminal() -> bool:
    """A person is watching: stderr is a terminal and this is not CI or a test."""
    quiet = ("CI", "PYTEST_CURRENT_TEST", "CHAIN_NO_PROGRESS")
    return sys.stderr.isatty() and not any(os.environ.get(k) for k in quiet)


@contextlib.contextmanager
def working(what: str) -> Iterator[None]:
    """Around work that may take long: `what` it is, shown once it passes AFTER_S."""
    start = time.perf_counter()
    shown: list[Any] = []  # the rich status, once started
    done = threading.Event()
    lock = threading.Lock()

    def show() -> None:
        with lock:
            if done.is_set():  # the work ended as the timer fired
                return
            if _terminal():
                from rich.console import Console

                status = Console(stderr=True).status(f"{what}...")
                status.start()
                shown.append(status)
            else:
                log.info("%s (%.0f s so far)", what, time.perf_counter() - start)

    timer = threading.Timer(AFTER_S, show)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        with lock:
            done.set()
            for status in shown:
                status.stop()
            shown.clear()
