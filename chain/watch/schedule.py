"""Which calls of a winner are re-verified: as many as `rate` of its run time pays for.

After each re-verification the next one is placed so that its measured cost (eager's run,
the float64 run, the comparison) over the winner's run time in between stays within `rate`:
`gap = cost / (rate * winner's time per call)`. Early on the gap is capped at the call
number, so calls 2, 4, 8, ... are re-verified until the gap the budget allows is reached:
a winner that goes wrong early is caught early, and in the long run the share tends to
`rate`. `rate` 1 re-verifies every call.
"""

from __future__ import annotations

import math


class Schedule:
    """The next call number to re-verify (`due`); `done` moves it on after one."""

    __slots__ = ("due", "rate")

    def __init__(self, rate: float, first: int = 2) -> None:
        self.rate = rate
        self.due = first if rate > 0 else math.inf

    def done(self, call: int, cost_s: float, call_s: float) -> None:
        """Call `call` was re-verified at `cost_s` on top of the winner's `call_s`."""
        if self.rate <= 0:  # a suspect call re-verified with the schedule off: still off
            return
        if self.rate >= 1:
            self.due = call + 1
            return
        gap = cost_s / (self.rate * max(call_s, 1e-7))
        self.due = call + max(1, min(math.ceil(gap), call))
