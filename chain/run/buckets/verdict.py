"""A bucket's timing against the general path, judged: whether it serves its shape, why not,
and whether the timing leaves the decision to the run-time race (chain.run.buckets.racing)."""

from __future__ import annotations

from chain.judge.speed import SpeedRules
from chain.judge.timing import FASTER, TIE, TIE_BAND, UNDECIDED, Timing, compare
from chain.report.records import Attempt


def why_not(
    best: Attempt | None, base: Timing, timings: dict[str, Timing], speed: SpeedRules
) -> str | None:
    """Why the fastest fixed-shape candidate does not serve the shape: it does not beat
    the general path (`serves`: paired by round, 99% confidence), or it is below the
    eager floor."""
    if best is None:
        return "no fixed-shape candidate passed"
    if not serves(compare(base.rounds_s, timings[best.backend].rounds_s)):
        versus = f"{best.backend}: {against(base, timings[best.backend])}"
        return f"no fixed-shape candidate beat the general path by 1% ({versus})"
    if (floor := speed.below_floor(best.backend, timings)) is not None:
        return f"{best.backend}: {floor}"
    return None


def against(base: Timing, timing: Timing) -> str:
    """A candidate against the general path, paired by round: `slower, 0.21x (99% CI ...)`."""
    versus = compare(base.rounds_s, timing.rounds_s)
    return f"{versus.verdict}, {versus.interval()}"


def serves(versus: Timing) -> bool:
    """Whether a bucket beats the general path: measurably faster (by 1%, 99%), or, still
    undecided when its rounds ran out, faster by 1% at the median and, with 99% confidence,
    at most 3% slower (the harm the chain allows a winner: the interval's low end)."""
    if versus.verdict == FASTER:
        return True
    return (
        versus.verdict == UNDECIDED
        and versus.speedup > 1.0 / (1.0 - TIE)
        and versus.speedup_lo >= 1.0 - TIE_BAND
    )


def undecided(versus: Timing, noisy: tuple[str, ...]) -> bool:
    """Whether a bucket's timing against the general path leaves it to the run-time race:
    undecided when its rounds ran out, or taken on noisy evidence (whatever its verdict)."""
    return bool(noisy) or versus.verdict == UNDECIDED
