"""The chain's speed rules: candidates timed against eager, the eager floor, min_speedup,
and `fastest` mode's pick. Verification says whether a backend may run a graph; these
rules say whether it should."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from chain.attempt import Mismatch, Reference, failed_attempt
from chain.records import Attempt, Status
from chain.timing import Timing, TimingError, measure

EAGER = "eager"  # the floor's name in reports: eager runs a graph no backend runs faster
EAGER_BIAS = 0.99  # a compiler must beat eager by 1% to win in "fastest" mode: noise never does
EAGER_REF = "<eager reference>"  # eager's timing among the candidates'

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

    def time(
        self, attempts: list[Attempt], fns: Fns, gm: fx.GraphModule, reference: Reference
    ) -> tuple[list[Attempt], dict[str, Timing]]:
        """Time eager and `fns` in one run; fill in latency, spread and speedup.

        A candidate that raises while timed becomes a runtime_error and leaves `fns`. One
        that returned `gm.forward` itself (the "eager" backend) is the reference: it takes
        the reference's timing rather than a second, noisy one of the same function.
        """
        same = [k for k, f in fns.items() if f == gm.forward]  # bound methods compare equal
        while True:
            try:
                timings = measure(
                    {EAGER_REF: gm.forward, **{k: f for k, f in fns.items() if k not in same}},
                    reference.inputs(),
                    baseline=EAGER_REF,
                    budget_s=self.budget_s,
                    stall_s=self.stall_s,
                )
                break
            except TimingError as err:
                if err.name not in fns or self.strict:
                    raise err.exc from None
                del fns[err.name]
                attempts = [
                    failed_attempt(
                        a.backend,
                        Status.RUNTIME_ERROR,
                        err.exc,
                        reason_prefix="while timed: ",
                        compile_s=a.compile_s,
                        details=a.details,
                    )
                    if a.backend == err.name
                    else a
                    for a in attempts
                ]
        timings.update({k: timings[EAGER_REF] for k in same})
        attempts = _weights_after_timing(attempts, fns, reference)
        attempts = _verified_after_timing(attempts, fns, reference, self.strict, same)
        return [
            dataclasses.replace(
                a,
                latency_ms=timings[a.backend].median_ms,
                spread_ms=timings[a.backend].spread_ms,
                speedup=timings[a.backend].speedup,
            )
            if a.backend in fns
            else a
            for a in attempts
        ], timings

    def judge(
        self,
        attempt: Attempt,
        fn: Callable[..., Any],
        last: bool,
        timings: dict[str, Timing],
        slow: Fns,
        floored: Fns,
    ) -> tuple[Attempt, Callable[..., Any] | None]:
        """`first` mode, a timed candidate: it wins, or is `slower` (below the eager floor:
        into `floored`; below min_speedup unless `last`: into `slow`, for the rescue)."""
        if attempt.status is not Status.WON:
            return attempt, None
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
        """Why a passing backend loses to eager: measurably slower (ties are not losses)."""
        timing, eager = timings[name], timings[EAGER_REF]
        if not self.eager_floor or name == EAGER or not timing.slower:
            return None
        return (
            f"measurably slower than eager: {timing.describe()} vs eager "
            f"{eager.median_ms:.3f} ± {eager.spread_ms:.3f} ms"
        )

    def pick_fastest(self, attempts: list[Attempt], eager: Timing | None) -> list[Attempt]:
        """Among passing attempts the fastest wins; eager wins unless beaten by 1%.

        With the floor (the default), eager competes whether or not the chain names it.
        """
        passing = [a for a in attempts if a.status is Status.WON]
        if not passing:
            return attempts
        best: Attempt | None = min(passing, key=lambda a: a.latency_ms or float("inf"))
        named = next((a for a in passing if a.backend == EAGER), None)
        eager_ms = named.latency_ms if named is not None else None
        if self.eager_floor and eager is not None:
            eager_ms = eager.median_ms
        if (
            best is not None
            and best is not named
            and eager_ms is not None
            and (best.latency_ms or 0) > EAGER_BIAS * eager_ms
        ):
            best = named  # None: the floor, which the chain appends (floor_attempt)
        against = (
            f"{best.latency_ms:.3f} ms for {best.backend}"
            if best is not None
            else f"eager's {eager_ms:.3f} ms (a backend must beat eager by 1%)"
        )
        return [
            a
            if a is best or a.status is not Status.WON
            else dataclasses.replace(
                a,
                status=Status.SLOWER,
                reason=f"{a.latency_ms:.3f} ± {a.spread_ms or 0:.3f} ms vs {against}",
            )
            for a in attempts
        ]

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
        )


def _weights_after_timing(attempts: list[Attempt], fns: Fns, reference: Reference) -> list[Attempt]:
    """The weights after the timed calls, as after each candidate's first run
    (`chain.isolation`): a change (undone where a snapshot was kept, else WeightsDamaged) makes
    the candidates timed together a `mismatch`; they leave `fns`. One candidate is timed at a
    time in `first` mode, so the reason names the one that did it."""
    timed = [a.backend for a in attempts if a.backend in fns]
    if reference.watch is None or not timed:
        return attempts
    reason = reference.watch.check(", ".join(timed))
    if reason is None:
        return attempts
    if len(timed) > 1:
        reason += f" (timed together: {', '.join(timed)})"
    for name in timed:
        del fns[name]
    return [
        dataclasses.replace(
            a, status=Status.MISMATCH, reason=f"while timed: {reason}", error_type="Mismatch"
        )
        if a.backend in timed
        else a
        for a in attempts
    ]


def _verified_after_timing(
    attempts: list[Attempt], fns: Fns, reference: Reference, strict: bool, same: list[str]
) -> list[Attempt]:
    """Each timed candidate verified once more, after its many timed calls: one that goes
    wrong after its first run (stale buffers, a cache, a fault) is a `mismatch` (or a
    `runtime_error`) and leaves `fns`, rather than win on the first run's verdict."""
    if reference.unverified or not reference.runnable:
        return attempts
    failed: dict[str, Attempt] = {}
    for a in attempts:
        if a.backend not in fns or a.backend in same:  # `same`: eager's own forward
            continue
        inputs = reference.inputs()
        try:
            with torch.no_grad():
                outputs = fns[a.backend](*inputs)
        except (Exception, SystemExit) as exc:  # SystemExit: the backend's failure
            if strict:
                raise
            failed[a.backend] = failed_attempt(
                a.backend,
                Status.RUNTIME_ERROR,
                exc,
                reason_prefix="after timing: ",
                compile_s=a.compile_s,
                details=a.details,
            )
            continue
        verdict = reference.verdict(outputs, inputs)
        if verdict.reason is not None:
            if strict:
                raise Mismatch(f"{a.backend}: after timing: {verdict.reason}")
            failed[a.backend] = dataclasses.replace(
                a,
                status=Status.MISMATCH,
                reason=f"after timing: {verdict.reason}",
                error_type="Mismatch",
            )
    for name in failed:
        del fns[name]
    return [failed.get(a.backend, a) for a in attempts]
