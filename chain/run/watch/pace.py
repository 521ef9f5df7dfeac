"""The winner's speed at run time against eager's, from the samples re-verification takes.

Each re-verification runs the winner and eager on the call's real inputs (`Watch.reverify`),
taking turns at going first (the second finds the caches warm; with turns that cannot
decide the sign test below on its own); where the graph writes its inputs eager runs
first, and the settled call the schedule times before the re-verification stands for the
winner. A pair of figures at no extra cost. Selection's speedup was measured once, maybe
on a busy machine; these pairs keep measuring it for the life of the winner. When in the
last `WINDOW` pairs the winner was slower than eager by more than `MARGIN` so often that
chance explains it with probability under `ALPHA` (a one-sided sign test), and the medians
agree, at `CONFIRM` re-verifications in a row (hysteresis: the windows overlap, so one
test at each pair tests the same evidence many times; with 3 in a row, a winner identical
to eager under bursty synthetic load was demoted in 47 of 300 runs of 1000 pairs, with a
window's worth in a row in none, and a 2x slower one still within 143 pairs: see
tests/test_demotion.py), the winner is demoted as slower
(recorded; the remembered decision is forgotten). A demoted winner's graph re-selects from
the next backend, eager always among them, so no demotion leaves a call unanswered.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

MARGIN = 0.03  # slower than eager by more than 3%: the bound the chain promises
MIN_PAIRS = 8  # fewer pairs decide nothing
WINDOW = 16  # the pairs judged: the most recent (the machine's load drifts)
ALPHA = 0.01  # a sign test this unlikely under "no slower" is "slower, with confidence"
CONFIRM = WINDOW  # consecutive "slower" verdicts before a demotion


class Pace:
    """Pairs of (the winner's settled call, eager's run) at run time, and the verdict."""

    __slots__ = ("pairs", "settled_s", "streak")

    def __init__(self) -> None:
        self.settled_s: float | None = None  # the winner's settled call before the next pair
        self.pairs: deque[tuple[float, float]] = deque(maxlen=WINDOW)
        self.streak = 0  # consecutive "slower" verdicts

    def winner(self, call_s: float) -> None:
        """A settled call of the winner took `call_s` (the schedule's clean call)."""
        self.settled_s = call_s

    def pair(self, winner_s: float | None, eager_s: float) -> str | None:
        """Eager's run in a re-verification took `eager_s`, the winner's call `winner_s`
        (None: eager ran first; the settled call before it stands in): the reason to demote
        the winner as slower, or None."""
        winner_s = winner_s if winner_s is not None else self.settled_s
        self.settled_s = None
        if winner_s is None:
            return None
        self.pairs.append((winner_s, eager_s))
        why = slower(list(self.pairs))
        self.streak = self.streak + 1 if why is not None else 0
        return why if self.streak >= CONFIRM else None


def slower(pairs: list[tuple[float, float]]) -> str | None:
    """Why (winner_s, eager_s) pairs say the winner is slower than eager by more than
    MARGIN with confidence (None: they do not)."""
    n = len(pairs)
    if n < MIN_PAIRS:
        return None
    behind = sum(w > e * (1 + MARGIN) for w, e in pairs)
    p = _tail(behind, n)
    winner_ms = statistics.median(w for w, _ in pairs) * 1e3
    eager_ms = statistics.median(e for _, e in pairs) * 1e3
    if p >= ALPHA or winner_ms <= eager_ms * (1 + MARGIN):
        return None
    return (
        f"slower than eager at run time: {winner_ms:.3f} ms against eager's {eager_ms:.3f} ms "
        f"({eager_ms / winner_ms:.2f}x), slower in {behind} of its last {n} re-verifications "
        f"(sign test p={p:.1e})"
    )


def _tail(k: int, n: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2)."""
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n
