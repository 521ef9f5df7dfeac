"""A clock for the chain's timing code that moves only when told, so a decision taken on
timings (a bucket against the general path, a winner slower than eager at run time) comes
out the same on a quiet machine and on a loaded one.

Each read of `perf_counter` advances it by `tick_s` (what any call costs, as the code sees
it); `sleep(s)` advances it by `s` without sleeping: a test backend that is "eager plus
3 ms a call" calls `clock.sleep(0.003)`. Real computation between two reads costs nothing.
`install` puts it in place of the `time` module (or the `perf_counter` name) that the
chain's timing modules read; everything else in them keeps the real clock.
"""

from __future__ import annotations

import threading
import time
import types
from typing import Any

import pytest

# the modules whose clock decides: selection's and a bucket's timing rounds; the run-time
# watch (its schedule and pace), the guard's general path and its fast path
ROUNDS = "chain.judge.rounds"
WATCH = ("chain.run.watch.watch", "chain.run.guard", "chain.run.watch.fast")


class VirtualClock:
    """Seconds that pass only by reads (`tick_s` each) and by `sleep`; thread-safe."""

    def __init__(self, tick_s: float = 1e-3) -> None:
        self.tick_s = tick_s
        self.now = 0.0
        self._lock = threading.Lock()

    def perf_counter(self) -> float:
        with self._lock:
            self.now += self.tick_s
            return self.now

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds

    def install(self, monkeypatch: pytest.MonkeyPatch, *modules: str) -> VirtualClock:
        """Read by `modules` (names) in place of the real clock, until the test ends."""
        for name in modules:
            module = __import__(name, fromlist=["_"])
            if isinstance(getattr(module, "time", None), types.ModuleType):
                monkeypatch.setattr(module, "time", _TimeModule(self))
            if hasattr(module, "perf_counter"):  # `from time import perf_counter`
                monkeypatch.setattr(module, "perf_counter", self.perf_counter)
        return self


class _TimeModule:
    """`time` as a module sees it: this clock's perf_counter and sleep, the rest real."""

    def __init__(self, clock: VirtualClock) -> None:
        self.perf_counter, self.sleep = clock.perf_counter, clock.sleep

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)
