"""Which calls of a winner are re-verified: as many as `rate` of its run time pays for.

The budget is kept over the whole run: after each re-verification the next one is placed
at the call by which `rate` of the winner's run time (calls so far times its mean measured
call) has paid for every re-verification so far (eager's run, the float64 run, the
comparison). Early on the gap is capped at the call number, so calls 2, 4, 8, ... are
re-verified (a winner that goes wrong early is caught early) until the budget is reached;
what those cost is repaid before the next, so over a long run the share is `rate`, early
checks included. `rate` 1 re-verifies every call.
"""

from __future__ import annotations

import math


class Schedule:
    """The next call number to re-verify (`due`); `done` moves it on after one."""

    __slots__ = ("due", "rate", "spent_s", "timed", "timed_s")

    def __init__(self, rate: float, first: int = 2) -> None:
        self.rate = rate
        self.due = first if rate > 0 else math.inf
        self.spent_s = 0.0  # every re-verification's cost so far
        self.timed_s = 0.0  # the winner's calls timed at those re-verifications
        self.timed = 0

    def done(self, call: int, cost_s: float, call_s: float) -> None:
        """Call `call` was re-verified at `cost_s` on top of the winner's `call_s`."""
        if self.rate <= 0:  # a suspect call re-verified with the schedule off: still off
            return
        if self.rate >= 1:
            self.due = call + 1
            return
        self.spent_s += cost_s
        self.timed_s += call_s
        self.timed += 1
        per_call = max(self.timed_s / self.timed, 1e-7)
        paid_by = math.ceil(self.spent_s / (self.rate * per_call))  # the call that pays
        self.due = min(2 * call, max(call + 1, paid_by))
