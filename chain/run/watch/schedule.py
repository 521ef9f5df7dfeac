"""Which calls of a winner are re-verified: as many as `rate` of its run time pays for.

The budget is kept over the whole run: after each re-verification the next one is placed
at the call by which `rate` of the winner's run time (calls so far times its usual call)
has paid for every re-verification so far. Early on the gap is capped at the call number,
so calls 2, 4, 8, ... are re-verified (a winner that goes wrong early is caught early)
until the budget is reached; what those cost is repaid before the next, so over a long run
the share is `rate`, early checks included. `rate` 1 re-verifies every call.

A re-verification costs more than its own time (eager's run, the float64 run, the
comparison): eager's run leaves the caches to eager, so the winner's call in it and the
few calls after it run slower (bert-tiny, calls of 1 ms, re-verifications of 2.5-2.8 ms: 0.1
to 0.4 ms in all over three runs, mostly on the next call; nothing measurable past the
fourth). So the schedule asks for those calls to be timed (`mark`), and for one settled
call before each re-verification, and books what they took over the settled calls' mean
as the re-verification's: `rate` is the share of run time it costs, not of what it books.
"""

from __future__ import annotations

import math

AFTER = 4  # the calls after a re-verification charged with the slowdown it leaves
SETTLED = 8  # a call this many after one is settled: its time is the usual call's


class Schedule:
    """The next call number to re-verify (`due`) and from which calls are timed (`mark`,
    never past `due`); `done` moves them on after a re-verification, `timed` after a
    timed call. Under concurrent calls the figures are approximate, never wrong in kind."""

    __slots__ = ("checks", "clean_s", "cleans", "due", "last", "mark", "rate", "spent_s", "timed_s")

    def __init__(self, rate: float, first: int = 2) -> None:
        self.rate = rate
        self.due: float = first if rate > 0 else math.inf
        self.mark: float = self.due  # calls from here on are timed (or, from `due`, checked)
        self.spent_s = 0.0  # every re-verification's cost so far, slowdowns booked included
        self.timed_s = 0.0  # the winner's calls timed in re-verifications, and how many
        self.checks = 0
        self.clean_s = 0.0  # the mean of the settled calls timed (0: none yet)
        self.cleans = 0
        self.last = -SETTLED  # the last call re-verified

    def done(self, call: int, cost_s: float, call_s: float) -> float:
        """Call `call` was re-verified at `cost_s` on top of the winner's `call_s`; returns
        what was booked beyond `cost_s` (the winner's call slowed by eager's run)."""
        if self.rate <= 0:  # a suspect call re-verified with the schedule off: still off
            return 0.0
        if self.rate >= 1:
            self.due = self.mark = call + 1
            return 0.0
        self.timed_s += call_s
        self.checks += 1
        slowed = call_s - self.clean_s if self.cleans else 0.0
        self.spent_s += cost_s + slowed
        usual = self.clean_s if self.cleans else self.timed_s / self.checks
        per_call = max(usual, 1e-7)
        paid_by = math.ceil(self.spent_s / (self.rate * per_call))  # the call that pays
        self.due = min(2 * call, max(call + 1, paid_by))
        self.last = call
        self.mark = self._after(call)
        return slowed

    def timed(self, call: int, call_s: float) -> float:
        """Call `call` (at or past `mark`, before `due`) took `call_s`: booked as a slowdown
        when it follows a re-verification closely, else kept as a settled call. Returns
        what was booked."""
        booked = 0.0
        if self.last < call <= self.last + AFTER:
            if self.cleans:
                booked = call_s - self.clean_s
                self.spent_s += booked
        elif call >= self.last + SETTLED:
            self.cleans += 1
            self.clean_s += (call_s - self.clean_s) / self.cleans
        self.mark = max(self.mark, self._after(call))
        return booked

    def _after(self, call: int) -> float:
        """The next call after `call` to time or re-verify: the rest of the calls charged
        after the last re-verification, else a settled one right before `due`, else `due`."""
        if call < self.last + AFTER and call + 1 < self.due:
            return call + 1
        clean = self.due - 1
        return clean if clean >= self.last + SETTLED and clean > call else self.due
