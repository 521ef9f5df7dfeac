"""For the few tests that time real calls (marker `timing`, run serially): a scenario is
retried while its own verdict is undecided, a bounded number of times; still undecided on
a busy machine it is skipped with the load that did it, never failed (an undecided verdict
under load is not a failure of the code). Undecided on a quiet machine, it fails.

Also `Captured`, a dynamo backend that keeps each guard a chain returns, so a test can
read a winner's watch (its pace pairs, its schedule).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
import torch
from torch import fx

from chain.judge.evidence import load_average, running_threads
from chain.judge.timing import BUSY_LIMIT, LOAD_LIMIT

T = TypeVar("T")
TRIES = 3  # a burst of load can spoil one timing, rarely three in a row


def machine_busy() -> str | None:
    """The load that can spoil a timing now, in words (None: the machine is quiet): other
    threads runnable, or the 1-minute load average, per CPU over the timing's own limits."""
    cpus = os.cpu_count() or 1
    runnable = running_threads()
    if runnable is not None and (others := max(runnable - 1, 0)) / cpus >= BUSY_LIMIT / 2:
        return f"{others} other threads runnable on {cpus} CPUs"
    load = load_average()
    if load is not None and load / cpus >= LOAD_LIMIT / 2:
        return f"load average {load:.1f} on {cpus} CPUs"
    return None


def until_decided(
    attempt: Callable[[], T], undecided: Callable[[T], str | None], tries: int = TRIES
) -> T:
    """`attempt()` until `undecided(result)` is None (its verdict decided: the caller then
    asserts on it), at most `tries` times; then a skip naming the load, or, on a quiet
    machine, a failure with each try's reason."""
    reasons = []
    for _ in range(tries):
        torch._dynamo.reset()
        result = attempt()
        why = undecided(result)
        if why is None:
            return result
        reasons.append(why)
    busy = machine_busy()
    if busy is None:
        pytest.fail(f"undecided {tries} times on a quiet machine: {'; '.join(reasons)}")
    pytest.skip(f"undecided under load ({busy}) after {tries} tries: {'; '.join(reasons)}")


class Captured:
    """A dynamo backend that compiles through `chain_backend` and keeps each guard, so a test
    can reach its watch; `setup(watch)` runs on each before its first call."""

    def __init__(self, chain_backend: Any, setup: Callable[[Any], None] | None = None) -> None:
        self.chain, self.setup = chain_backend, setup
        self.guards: list[Any] = []

    @property
    def report(self) -> Any:
        """The chain's report."""
        return self.chain.report

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        guard = self.chain(gm, example_inputs)
        if self.setup is not None:
            self.setup(guard.active.watch)
        self.guards.append(guard)
        return guard
