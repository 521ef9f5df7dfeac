"""The chain's speed rules: candidates timed against eager, the eager floor, min_speedup,
and `fastest` mode's pick. Verification says whether a backend may run a graph; these
rules say whether it should."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import fx

from chain.judge.timing import (
    FASTER,
    REFERENCE,
    SLOWER,
    TIED,
    UNDECIDED,
    Timing,
)
from chain.report.records import Attempt, GraphRecord, Status

EAGER = "eager"  # the floor's name in reports: eager runs a graph no backend runs faster
EAGER_BIAS = 0.99  # a compiler must beat eager by 1% to win in "fastest" mode: noise never does
EAGER_REF = "<eager reference>"  # eager's timing among the candidates'
UNDECIDED_MORE = 4  # undecided after the budget: up to 4 budgets more of rounds, then eager
QUIET_S = 5.0  # the longest wait for another compile in the process to end before timing

Fns = dict[str, Callable[..., Any]]


@dataclass(frozen=True)
class SpeedRules:
    """The chain's speed options, and the verdicts they give on timed attempts."""

    eager_floor: bool
    min_speedup: float | None
    measure: bool
    strict: bool
    budget_s: float
    stall_s: float | None = None  # compile_timeout_s: the longest one timed call may take
    quiet_s: float = QUIET_S  # the longest wait for other compiles to end before timing

    def judge(
        self,
        attempt: Attempt,
        fn: Callable[..., Any],
        last: bool,
        timings: dict[str, Timing],
        slow: Fns,
        floored: Fns,
        raced: bool = False,
    ) -> tuple[Attempt, Callable[..., Any] | None]:
        """`first` mode, a timed candidate: it wins, or is `slower` (below the eager floor,
        undecided included: into `floored`; below min_speedup unless `last`: into `slow`,
        for the rescue). `raced`: the graph's run-time race goes on after selection, so an
        undecided candidate ahead of eager (`leads`) wins provisionally instead: it serves
        while the race (eager in it) decides, and the chain's later backends challenge it."""
        if attempt.status is not Status.WON:
            return attempt, None
        if raced and leads(timings[attempt.backend]) and not self.too_slow(attempt):
            return attempt, fn
        if reason := self.below_floor(attempt.backend, timings):
            floored[attempt.backend] = fn
            return dataclasses.replace(attempt, status=Status.SLOWER, reason=reason), None
        if self.too_slow(attempt) and not last:
            slow[attempt.backend] = fn
            reason = f"{attempt.speedup:.2f}x over eager < min_speedup {self.min_speedup}"
            return dataclasses.replace(attempt, status=Status.SLOWER, reason=reason), None
        return attempt, fn

    def too_slow(self, attempt: Attempt) -> bool:
        """Below min_speedup (when one is set and the attempt was timed)."""
        if self.min_speedup is None or attempt.speedup is None:
            return False
        return attempt.speedup < self.min_speedup

    def below_floor(self, name: str, timings: dict[str, Timing]) -> str | None:
        """Why a passing backend loses to eager: measurably slower, or undecided once the
        rounds ran out (ties are not losses; eager itself never loses to itself)."""
        timing, eager = timings[name], timings[EAGER_REF]
        if not self.eager_floor or timing.verdict in (FASTER, TIED, REFERENCE):
            return None
        return lost_to_eager(timing, eager)

    def pick_fastest(self, attempts: list[Attempt], eager: Timing | None) -> list[Attempt]:
        """Among passing attempts the fastest wins; under the floor only one measurably
        faster than eager (by 1%, with 99% confidence) can beat eager.

        With the floor (the default), eager competes whether or not the chain names it.
        """
        passing = [a for a in attempts if a.status is Status.WON]
        if not passing:
            return attempts
        named = next((a for a in passing if a.backend == EAGER), None)
        if self.eager_floor and eager is not None:
            faster = [a for a in passing if a.verdict == FASTER]
            best = min(faster, key=_latency) if faster else named  # None: the floor
        else:
            best = _fastest_unfloored(passing, named)
        return [
            a if a is best or a.status is not Status.WON else self._beaten(a, best, eager)
            for a in attempts
        ]

    def _beaten(self, attempt: Attempt, best: Attempt | None, eager: Timing | None) -> Attempt:
        """A passing attempt that lost in `fastest` mode, with why: to `best`, or to eager."""
        if best is not None and best.backend != EAGER:
            reason = (
                f"{attempt.latency_ms:.3f} ± {attempt.spread_ms or 0:.3f} ms vs "
                f"{best.latency_ms:.3f} ms for {best.backend}"
            )
        elif eager is None:
            reason = f"{attempt.latency_ms:.3f} ± {attempt.spread_ms or 0:.3f} ms: eager kept"
        else:
            reason = lost_to_eager(_as_timing(attempt), eager)
        return dataclasses.replace(attempt, status=Status.SLOWER, reason=reason)

    def explained(self, attempts: list[Attempt]) -> list[Attempt]:
        """The winner's reason says why it won on speed: its speedup and interval, a kept
        tie as one (whatever reason it had stays after it)."""
        return [
            dataclasses.replace(a, reason="; ".join(filter(None, (a.reason, why))))
            if a.status is Status.WON and (why := self.why_won(a)) and why not in a.reason
            else a
            for a in attempts
        ]

    def why_won(self, attempt: Attempt) -> str | None:
        """A timed winner's case against eager, in words; None when it was not timed."""
        if attempt.verdict is None or attempt.speedup_lo is None:
            return None
        figures = _as_timing(attempt).describe() + _rounds(attempt)
        if attempt.verdict == REFERENCE:
            return "eager itself, the reference: 1.00x by construction"
        if attempt.verdict == FASTER:
            return f"faster than eager: {figures}"
        if attempt.verdict == TIED:
            return f"a tie with eager, kept (a tie is not a loss): {figures}"
        if attempt.verdict == UNDECIDED and self.eager_floor:
            return (
                f"undecided against eager but ahead: it serves while the run-time race "
                f"decides: {figures}"
            )
        floor = "" if self.eager_floor else ", kept: eager_floor=False"
        return f"{attempt.verdict} against eager{floor}: {figures}"

    def rescue_slower(self, attempts: list[Attempt], slow: Fns, passed: Fns) -> list[Attempt]:
        """No candidate reached min_speedup: the fastest that passed verification wins anyway
        (among those not measurably slower than eager: the others lost to the floor)."""
        candidates = [a for a in attempts if a.backend in slow]
        if not candidates:
            return attempts
        best = max(candidates, key=lambda a: a.speedup or 0.0)
        passed[best.backend] = slow[best.backend]
        reason = f"no backend reached min_speedup {self.min_speedup}; the fastest that passed"
        return [
            dataclasses.replace(a, status=Status.WON, reason=reason) if a is best else a
            for a in attempts
        ]

    def floor_needed(self, attempts: list[Attempt]) -> bool:
        """Backends passed verification but all lost to eager on speed: eager runs the graph."""
        return (
            self.eager_floor
            and self.measure
            and not any(a.status is Status.WON for a in attempts)
            and any(a.status is Status.SLOWER for a in attempts)
            and EAGER not in {a.backend for a in attempts}
        )

    @staticmethod
    def floor_attempt(eager: Timing | None) -> Attempt:
        """Eager as the floor: it runs the graph because no backend of the chain beat it."""
        return Attempt(
            EAGER,
            Status.WON,
            "the floor: no backend of the chain beat eager (eager_floor=False to opt out)",
            latency_ms=eager.median_ms if eager else None,
            spread_ms=eager.spread_ms if eager else None,
            speedup=1.0 if eager else None,
            speedup_lo=1.0 if eager else None,
            speedup_hi=1.0 if eager else None,
            verdict=REFERENCE if eager else None,
            evidence=eager.evidence if eager else None,
        )


def floor_at_run_time(eager: Timing | None) -> Attempt:
    """Eager after a winner failed at run time and no later backend of the chain passed:
    the last resort, whatever the chain lists (a run-time fallback never leaves a call
    without an answer)."""
    attempt = SpeedRules.floor_attempt(eager)
    return dataclasses.replace(
        attempt, reason="the last resort at run time: no later backend of the chain passed"
    )


def leads(timing: Timing) -> bool:
    """Undecided against eager, but its median ratio is ahead (the race's lead, not a
    verdict: `first` mode serves it while the run-time race decides)."""
    return timing.verdict == UNDECIDED and timing.speedup > 1.0


def not_decided(record: GraphRecord) -> str | None:
    """Why a graph's decision is not decided enough to remember: it compared speeds (a
    candidate other than eager was timed) and its timing was noisy, or its winner was
    undecided against eager. One that compared none (eager alone) holds under any load."""
    compared = [a for a in record.attempts if a.verdict not in (None, REFERENCE)]
    if not compared:
        return None
    won = record.winning_attempt
    if won is not None and won.verdict == UNDECIDED:
        return f"{won.backend} won undecided against eager ({_as_timing(won).interval()})"
    timing = record.timing
    if timing is not None and timing.noisy:
        return f"the timing was noisy ({'; '.join(timing.noisy)})"
    return None


def is_reference(name: str, fn: Callable[..., Any], gm: fx.GraphModule) -> bool:
    """Whether a candidate is eager's reference run: the eager backend (named so in the
    registry), or a backend that returned `gm.forward` itself (bound methods compare equal)."""
    return name == EAGER or fn == gm.forward


def timed(attempt: Attempt, timing: Timing) -> Attempt:
    """`attempt` with its figures from `timing`: latency, spread, speedup and interval,
    verdict, and the run's evidence."""
    return dataclasses.replace(
        attempt,
        latency_ms=timing.median_ms,
        spread_ms=timing.spread_ms,
        speedup=timing.speedup,
        speedup_lo=timing.speedup_lo,
        speedup_hi=timing.speedup_hi,
        verdict=timing.verdict,
        evidence=timing.evidence,
    )


def lost_to_eager(timing: Timing, eager: Timing) -> str:
    """Why a candidate lost to eager: measurably slower, a tie (fastest mode: eager kept),
    or undecided when the rounds ran out."""
    against = f"vs eager {eager.median_ms:.3f} ± {eager.spread_ms:.3f} ms"
    if timing.verdict == SLOWER:
        return f"measurably slower than eager: {timing.describe()} {against}"
    if timing.verdict == TIED:
        return (
            f"a tie with eager: {timing.describe()} {against}; eager kept (a backend must "
            "beat eager by 1% with 99% confidence)"
        )
    return (
        f"undecided against eager after {timing.samples} rounds: {timing.describe()} "
        f"{against}; eager kept (the floor)"
    )


def _latency(attempt: Attempt) -> float:
    return attempt.latency_ms if attempt.latency_ms is not None else float("inf")


def _fastest_unfloored(passing: list[Attempt], named: Attempt | None) -> Attempt | None:
    """Without the floor: the fastest passing attempt, unless the named eager is within 1%."""
    best = min(passing, key=_latency)
    if named is None or best is named or named.latency_ms is None:
        return best
    return named if _latency(best) > EAGER_BIAS * named.latency_ms else best


def _as_timing(attempt: Attempt) -> Timing:
    """A timed attempt's figures as a Timing (for the wording of its reason)."""
    return Timing(
        median_ms=attempt.latency_ms or 0.0,
        spread_ms=attempt.spread_ms or 0.0,
        samples=attempt.evidence.rounds if attempt.evidence is not None else 0,
        speedup=attempt.speedup or 0.0,
        speedup_lo=attempt.speedup_lo or 0.0,
        speedup_hi=attempt.speedup_hi or 0.0,
        verdict=attempt.verdict or UNDECIDED,
    )


def _rounds(attempt: Attempt) -> str:
    """`, in 24 rounds` (empty when the run's evidence is not on the attempt)."""
    evidence = attempt.evidence
    return f", in {evidence.rounds} rounds" if evidence is not None else ""
