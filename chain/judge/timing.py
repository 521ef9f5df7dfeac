"""Latency of several callables on the same inputs, without bias by position, and a verdict
for each against the baseline that says when it cannot tell.

Measured on CPU: whatever is timed right after an ONNX Runtime call runs ~25 us slower, so
single calls interleaved in a fixed order made eager read 0.62x or 1.55x of itself. Here
each round runs the candidates in a fresh random order, each in a block: one untimed
lead-in call (it absorbs the switch from another runtime), then back-to-back timed calls
filling ~`block_s`, CUDA-synchronized. A round gives one sample per candidate, and one
paired ratio baseline/candidate (drift during the round hits both alike).

Verdicts, from the 99% confidence interval of the paired ratio (order statistics of the
median, so one stalled round cannot decide anything): `faster` (the interval above 1 and
the speedup over 1.01: the 2022 TorchDynamo autotuner's margin), `slower` (below 1, under
0.99), `tie` (the interval within 3% of 1), else `undecided`. Rounds go on until every
candidate is decided or the budget is spent; the caller treats undecided as a loss to the
baseline (the eager floor). Each run carries its evidence (rounds, eager's own spread, the
threads runnable machine-wide while timed, else the load average, compiles running in the
process) and says when its figures are noisy; an implausible figure (over 50x on CPU, an
interval wider than 10x) is timed once more first.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from chain.judge.evidence import Machine
from chain.report.records import FASTER, REFERENCE, SLOWER, TIED, UNDECIDED, TimingEvidence

Z = 2.576  # 99% two-sided: a tie is called a loss (or a win) in well under 1% of graphs
TIE = 0.01  # a win or a loss must be by over 1%: ratios within 1% of 1 never decide one
TIE_BAND = 0.03  # an interval within 3% of 1 is a decided tie (no loss, no win)
MIN_ROUNDS = 12  # below ~12 rounds the 99% interval of a median is the whole range
EAGER_SPREAD = 0.25  # eager's own rounds spread over 25% of their median: noisy
BUSY_LIMIT = 1.0  # other threads runnable while timed, per CPU: at this, no core is ours
LOAD_LIMIT = 1.25  # without that count (not Linux): the 1-minute load average per CPU
WIDE = 10.0  # a speedup interval wider than this (hi / lo): noisy, and re-timed first
IMPLAUSIBLE = {"cpu": 50.0, "cuda": 500.0}  # speedups re-timed before they are believed


@dataclass
class Progress:
    """The call in flight in a stage of many calls (timing): the deadline counts per call,
    except for a call that is not `bounded` (eager's own: the floor is never abandoned)."""

    name: str = ""
    since: float = field(default_factory=time.perf_counter)
    bounded: bool = True

    def start(self, name: str, bounded: bool = True) -> None:
        self.name, self.since, self.bounded = name, time.perf_counter(), bounded


# runs `fn(progress)` with each call it starts under a deadline of `stall_s`; raises a
# TimeoutError when one overruns it (chain.select.worker.timing_deadline)
Deadline = Callable[[Callable[["Progress"], Any], float, "Progress"], Any]


class TimingError(Exception):
    """A candidate raised while being timed; `name` says which."""

    def __init__(self, name: str, exc: Exception) -> None:
        super().__init__(f"{name} raised while being timed: {exc}")
        self.name = name
        self.exc = exc


@dataclass(frozen=True)
class Timing:
    """One candidate's latency: median per call, the spread of that median, the speedup
    over the baseline with its 99% confidence interval (paired by round) and the verdict
    that interval gives; `rounds_s` are its per-call seconds, one per round."""

    median_ms: float
    spread_ms: float  # half-width of the 99% confidence interval of the median
    samples: int  # timed blocks
    speedup: float  # baseline median / this median
    speedup_lo: float
    speedup_hi: float
    verdict: str = UNDECIDED
    rounds_s: tuple[float, ...] = ()
    evidence: TimingEvidence | None = None

    @property
    def slower(self) -> bool:
        """Measurably slower than the baseline: the whole interval below 1, by over 1%."""
        return self.verdict == SLOWER

    @property
    def faster(self) -> bool:
        """Measurably faster than the baseline: the whole interval above 1, by over 1%."""
        return self.verdict == FASTER

    def interval(self) -> str:
        """The speedup with its interval: `1.45x (99% CI 1.38-1.52x)`."""
        return f"{self.speedup:.2f}x (99% CI {self.speedup_lo:.2f}-{self.speedup_hi:.2f}x)"

    def describe(self) -> str:
        return f"{self.median_ms:.3f} ± {self.spread_ms:.3f} ms, {self.interval()}"


def verdict_of(speedup: float, lo: float, hi: float) -> str:
    """faster, slower, tie or undecided: a speedup and its confidence interval against 1."""
    if hi < 1.0 and speedup < 1.0 - TIE:
        return SLOWER
    if lo > 1.0 and speedup > 1.0 / (1.0 - TIE):
        return FASTER
    if lo >= 1.0 - TIE_BAND and hi <= 1.0 / (1.0 - TIE_BAND):
        return TIED
    return UNDECIDED


def median_ci(values: Sequence[float], z: float = Z) -> tuple[float, float]:
    """Distribution-free confidence interval of the median (order statistics, binomial)."""
    ordered = sorted(values)
    n = len(ordered)
    half = z * math.sqrt(n) / 2
    lo = max(0, round(n / 2 - half) - 1)
    hi = min(n - 1, round(1 + n / 2 + half) - 1)
    return ordered[lo], ordered[hi]


def compare(base: Sequence[float], other: Sequence[float], z: float = Z) -> Timing:
    """`other`'s timing against `base`, both per-call seconds of the same rounds."""
    median = statistics.median(other)
    lo, hi = median_ci(other, z)
    ratios = [b / s for b, s in zip(base, other, strict=True)]
    s_lo, s_hi = median_ci(ratios, z)
    speedup = statistics.median(base) / median
    return Timing(
        median_ms=1000 * median,
        spread_ms=1000 * (hi - lo) / 2,
        samples=len(other),
        speedup=speedup,
        speedup_lo=s_lo,
        speedup_hi=s_hi,
        verdict=verdict_of(speedup, s_lo, s_hi),
        rounds_s=tuple(other),
    )


def timings_of(
    samples: Mapping[str, Sequence[float]], baseline: str, z: float = Z
) -> dict[str, Timing]:
    """Every candidate's Timing from its per-round seconds; the baseline's is 1.0 exactly."""
    out = {name: compare(samples[baseline], values, z) for name, values in samples.items()}
    out[baseline] = dataclasses.replace(
        out[baseline], speedup=1.0, speedup_lo=1.0, speedup_hi=1.0, verdict=REFERENCE
    )
    return out


def implausible(timings: Mapping[str, Timing], device: str) -> list[str]:
    """The figures not to believe unchecked: a speedup over IMPLAUSIBLE[device], or an
    interval across 1 wider than WIDE (its high end over WIDE times its low end); one
    wholly on one side of 1 decides, however wide."""
    limit = IMPLAUSIBLE.get(device, IMPLAUSIBLE["cpu"])
    out = []
    for name, t in timings.items():
        if t.verdict == REFERENCE:
            continue
        if t.speedup > limit:
            out.append(f"{name} at {t.speedup:.0f}x (over {limit:g}x on {device})")
        elif t.speedup_lo < 1.0 < t.speedup_hi and t.speedup_hi > WIDE * t.speedup_lo:
            out.append(f"{name}'s interval {t.speedup_lo:.2f}-{t.speedup_hi:.2f}x (over {WIDE:g}x)")
    return out


def evidence_of(
    eager: Sequence[float],
    timings: Mapping[str, Timing],
    device: str,
    machine: Machine,
    retimed: int,
    seconds: float,
) -> TimingEvidence:
    """What the run saw, and why its figures may not hold (`noisy`): eager's own rounds
    spread, other threads wanting the cores (runnable while timed; where that count is
    unknown, the load average), compiles beside it, an implausible figure."""
    cpus = os.cpu_count() or 1
    spread = _spread(eager)
    seen = [x for x in machine.loads if x is not None]
    load = max(seen) / cpus if seen else None
    others = statistics.median(machine.runnable) - 1 if machine.runnable else None
    busy = None if others is None else max(others, 0.0) / cpus
    noisy = []
    if spread > EAGER_SPREAD:
        noisy.append(f"eager's own rounds spread {spread:.0%} of their median")
    if busy is not None and busy >= BUSY_LIMIT:
        noisy.append(f"{others:g} other threads runnable on {cpus} CPUs while timed")
    elif busy is None and load is not None and load > LOAD_LIMIT:
        noisy.append(f"machine load {max(seen):.1f} on {cpus} CPUs")
    if machine.compiles:
        noisy.append(f"compiling meanwhile: {', '.join(sorted(set(machine.compiles)))}")
    noisy += implausible(timings, device)
    return TimingEvidence(
        rounds=len(eager),
        seconds=round(seconds, 6),
        eager_spread=round(spread, 6),
        load=None if load is None else round(load, 4),
        cpus=cpus,
        busy=None if busy is None else round(busy, 4),
        retimed=retimed,
        noisy=tuple(noisy),
    )


def _spread(values: Sequence[float]) -> float:
    """Interquartile range over median: how much a timing run's rounds disagree."""
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4)
    median = statistics.median(values)
    return (q3 - q1) / median if median > 0 else 0.0
