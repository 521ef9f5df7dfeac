"""How busy the machine is while a timing run goes on: threads runnable machine-wide (Linux),
else the load average, and the compiles in this process beside it."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass


def running_threads() -> int | None:
    """Threads runnable now, machine-wide, this one included (Linux: /proc/loadavg's
    fourth field); None elsewhere. Unlike the 1-minute load average it does not lag: a
    compile that ended seconds ago is not counted."""
    try:
        with open("/proc/loadavg", encoding="ascii") as f:
            return int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):  # not Linux, or not its format
        return None


@dataclass(frozen=True)
class Machine:
    """What the machine did around a timing run: load averages at its start and end, the
    threads runnable after each round, the compiles running in this process."""

    loads: Sequence[float | None]
    runnable: Sequence[int]
    compiles: Sequence[str]


def load_average() -> float | None:
    """The 1-minute load average (None where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # not on this platform
        return None
