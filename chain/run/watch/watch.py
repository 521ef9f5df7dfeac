"""One winner under watch: the cheap checks of every call, and re-verification of some.

Built by the chain from what selection already has (eager's outputs on the example inputs,
the inputs it wrote, the float64 reference when there was one); the guard calls `check`
after each call of the winner and `reverify` on the calls the schedule picks.
Re-verification uses selection's rule (`chain.judge.verify.compare`) against an eager run on the
call's own arguments, before the winner's call and on copies of what the graph writes, so
no write is applied twice. As for a remembered winner, a winner within the bound that
eager's recorded error against float64 gives (`chain.judge.accuracy.near_eager`) passes on that
eager run alone; float64 runs only for what that does not clearly pass. On the suite's
tiny BERT a re-verification went from 2.8 ms (eager, float64, every weight's fingerprint)
to about 1.1 ms, so the same budget re-verifies about twice as often.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from backends.common.versions import version, versions
from chain.judge.fp64 import fp64_graph, fp64_inputs
from chain.judge.verify import compare, unchanged
from chain.run.watch.expect import Expected
from chain.run.watch.pace import Pace
from chain.run.watch.reuse import Reuse
from chain.run.watch.schedule import SETTLED, Schedule
from chain.run.watch.stats import RunChecks
from chain.run.watch.weights import Weights
from chain.run.watch.writes import Writes

# The NaN/inf scan (one sum per CPU output) may cost this share of a call (or half the
# reverify_rate, when that is more); past it, a random sample of calls is scanned, never
# fewer than SCAN_FLOOR of them. Right after a graph's own ops the first kernel is slow
# whatever it is (a torch or numpy sum, a max): on bert-tiny (1.3 ms calls) 18-27 us for
# the sum of its output, 4 us for a second sum; so the sum is timed in a re-verification.
SCAN_SHARE = 0.0025
SCAN_FLOOR = 1 / 32


HELD_BYTES = 64 * 2**20  # the largest total size of activations copied per re-verification


class Demoted(Exception):
    """A winner caught wrong at run time: the chain records a mismatch and moves on."""

    def __init__(self, call: int, reason: str) -> None:
        super().__init__(f"at call {call}: {reason}")
        self.call = call
        self.reason = reason


class TooSlow(Demoted):
    """A winner slower than eager with confidence at run time (`chain.run.watch.pace`): the
    chain records it as slower and moves on."""


class Watch:
    """The run-time checks of one winner of one graph (a new Watch per winner)."""

    def __init__(
        self,
        gm: fx.GraphModule,
        expected: Expected | None,
        writes: Writes | None,
        stats: RunChecks,
        *,
        reverify_rate: float,
        tolerances: dict[torch.dtype, tuple[float, float]] | None,
        fp64: bool,
        weights: Weights | None = None,
        name: str = "",
        versioned: Sequence[int] = (),
        recorded: Sequence[float | None] | None = None,
        reductions: Sequence[int] = (),
        pace: bool = True,
    ) -> None:
        """`recorded`: per output, eager's relative error against float64 at selection (None:
        float64 runs at every re-verification); `reductions`: per output, how many values it
        sums over (`chain.judge.accuracy`); `pace`: whether a winner slower than eager at run
        time is demoted (`chain.run.watch.pace`: only where eager can take over, the floor)."""
        self.gm = gm
        self.expected = expected
        self.writes = writes
        self.stats = stats
        self.tolerances = tolerances
        self.fp64 = fp64
        self.recorded = tuple(recorded) if recorded is not None else None
        self.reductions = tuple(reductions)
        self.weights = weights  # at each re-verification: did the winner's call change one?
        self.name = name  # the winner's, for WeightsDamaged
        # the guard's: an update seen by value (no counter moved) before a re-verified call
        self.on_update: Callable[[Sequence[Any]], None] | None = None
        written = set(writes.positions) if writes is not None else set()
        self.versioned = tuple(i for i in versioned if i not in written)
        self.counter = itertools.count(1)  # next() is atomic: call numbers under threads
        self.counts_calls = True  # False for a bucket's watch: the record counts the graph's
        self.fast: Callable[..., Any] | None = None  # a bucket's usual call (watch.fast)
        self.schedule = Schedule(reverify_rate if expected is not None else 0.0)
        self.scan_share = 1.0  # of calls scanned for NaN/inf: all until measured
        self.scan_budget = max(SCAN_SHARE, reverify_rate / 2)
        self._draw = random.Random(0).random  # which calls are scanned (seeded: repeatable)
        self.reuse = Reuse(expected.fresh) if expected is not None and expected.fresh else None
        self.pace = Pace() if pace else None  # the winner's speed against eager's, at run time
        self._fp64_gm: fx.GraphModule | None = None
        self._lock = threading.Lock()  # the float64 copy is built once

    def versions(self, args: Sequence[Any]) -> list[int]:
        """Before a call: the version counters of the activations eager does not write
        (`versioned`), to catch a winner writing them. The weights' (parameters and
        buffers) are read at each re-verification, with their fingerprints (`weights`): a
        read of every weight per call would cost several percent of a small model's."""
        return versions(args, self.versioned)

    def wrote(self, args: Sequence[Any], before: list[int]) -> list[int]:
        """After a call: the inputs whose version moved though eager does not write them."""
        return [i for i, v in zip(self.versioned, before, strict=True) if version(args[i]) != v]

    def call_number(self) -> int:
        """The number of this call of the winner (1, 2, ...), counted on the record."""
        n = next(self.counter)
        if self.counts_calls:
            self.stats.calls = n
        return n

    def check(
        self, n: int, args: Sequence[Any], out: Any, scan: bool | None = None
    ) -> tuple[str | None, bool]:
        """The cheap checks: (why `out` is wrong, whether to re-verify this call at once).
        `scan`: whether to scan the outputs for NaN/inf (None: as `scan_share` draws)."""
        if self.expected is None:
            return None, False
        if scan is None:
            share = self.scan_share
            scan = share >= 1.0 or self._draw() < share
        reason, suspect = self._outputs(n, args, out, scan)
        return reason, suspect or n >= self.schedule.due

    def _outputs(
        self, n: int, args: Sequence[Any], out: Any, scan: bool
    ) -> tuple[str | None, bool]:
        """Call `n`'s output checks: as eager's (`Expected`), and not memory handed out
        at an earlier call."""
        assert self.expected is not None
        reason, suspect = self.expected.check(args, out, scan)
        if reason is None and self.reuse is not None:
            reason = self.reuse.check(n, self.expected.leaves(out))
        return reason, suspect

    def can_reverify_after(self, kept: dict[int, Any] | None) -> bool:
        """Whether eager can still run as of before a call that has run: nothing written, or
        copies of it kept (past the snapshot cap, a suspect call is left unchecked)."""
        return self.writes is None or (kept is not None and self.writes.snapshots)

    def reverify(
        self,
        n: int,
        args: Sequence[Any],
        kept: dict[int, Any] | None,
        run: Callable[[], Any],
        timed: bool = True,
    ) -> tuple[Any, str | None]:
        """Run `run` (the winner's call, or its output already computed: `timed` False) and
        eager on the same inputs, and compare as selection does. Eager runs first where the
        graph writes its inputs (on copies of what it writes); else the two take turns going
        first (whichever runs second finds the caches warm: the turns cancel that out), and
        both times go to the run-time speed check (`chain.run.watch.pace`). A timed call moves
        the schedule on and re-measures the NaN/inf scan's share.

        Returns the winner's output and why it is wrong (None: it matches eager); raises
        TooSlow for a right winner that is slower than eager with confidence.
        """
        who = f"{self.name}, the winner (at run time, call {n})"
        token = self.weights.before(args, who) if self.weights is not None else None
        if token is not None and token[2] and self.on_update is not None:
            self.on_update(args)  # refreshed before the winner answers on them
            token = (*token[:3], self.weights.epoch)  # the baseline the winner's call starts on
        start = time.perf_counter()
        winner_first = timed and self.writes is None and self.stats.reverified % 2 == 1
        held = self._activations(args) if timed else None
        wrote = None
        if winner_first:
            call_start = time.perf_counter()  # the copies for the check are not the call's
            out = run()
            call_s = time.perf_counter() - call_start
            wrote = _restored(args, held) if held else None  # put back before eager reads
            eager_args = before = list(args)
        else:
            eager_args = self.writes.eager_inputs(args, kept or {}) if self.writes else list(args)
            # float64 needs the inputs as of before the call too, and eager is about to write
            # the copies in eager_args: a second set of copies of what the graph writes
            before = self.writes.eager_inputs(args, kept or {}) if self.writes else eager_args
        eager_start = time.perf_counter()
        with torch.no_grad():
            expected = self.gm(*eager_args)
        eager_s = time.perf_counter() - eager_start
        if not winner_first:
            out = run()
            call_s = time.perf_counter() - eager_start - eager_s
            wrote = _restored(args, held) if held else None
        reason = self._outputs(n, args, out, False)[0] if self.expected is not None else None
        if timed and reason is None and self.expected is not None and self.expected.scans:
            scan_start = time.perf_counter()
            self.expected.finite(out)  # timed: a NaN/inf is for the comparison below to name
            self.share_scans(time.perf_counter() - scan_start, call_s)
        if reason is None:
            reason = self._judge(expected, out, before)
        if reason is None and self.writes is not None:
            positions = self.writes.positions  # the inputs eager writes: as eager leaves them?
            verdict = compare(
                [eager_args[i] for i in positions], [args[i] for i in positions], self.tolerances
            )
            if verdict.reason is not None:
                reason = f"inputs {list(positions)} not written as eager does: {verdict.reason}"
        # the activations eager leaves alone: as they were? (a `.data` write, or an inference
        # tensor's: no version counter moves)
        reason = wrote or reason
        if self.weights is not None and token is not None:  # changed across the call: damage
            damaged = self.weights.across(args, token, who)  # WeightsDamaged: values changed
            reason = reason or damaged
        cost_s = time.perf_counter() - start - call_s
        slow = None
        if timed and reason is None and self.pace is not None:
            slow = self.pace.pair(call_s if self.writes is None else None, eager_s)
        self.stats.reverified += 1
        if timed:  # with what eager's run slowed the winner's call by
            cost_s += self.schedule.done(n, cost_s, call_s)
        self.stats.reverify_s += cost_s
        if slow is not None:  # right, but slower than eager with confidence
            raise TooSlow(n, slow)
        return out, reason

    def _activations(self, args: Sequence[Any]) -> dict[int, torch.Tensor]:
        """Copies of the activations eager does not write, to compare after the winner's
        call (up to `HELD_BYTES`: past it the version counters alone watch them)."""
        size = sum(args[i].numel() * args[i].element_size() for i in self.versioned)
        if not self.versioned or size > HELD_BYTES:
            return {}
        with torch.no_grad():
            return {i: args[i].clone() for i in self.versioned}

    def timed(self, n: int, call_s: float) -> None:
        """Call `n`, one the schedule asked to time, took `call_s`: what a re-verification
        slowed it by is booked to the re-verifications (`reverify_s`, the budget)."""
        if self.pace is not None and n >= self.schedule.last + SETTLED:  # a settled call
            self.pace.winner(call_s)
        self.stats.reverify_s += self.schedule.timed(n, call_s)

    def share_scans(self, scan_s: float, call_s: float) -> None:
        """Scan as many calls for NaN/inf as `scan_budget` of the call time pays for, from a
        scan measured at `scan_s` on a call of `call_s` (at each re-verification)."""
        paid = self.scan_budget * call_s / max(scan_s, 1e-9)
        self.scan_share = min(1.0, max(SCAN_FLOOR, paid))
        self.stats.scanned = round(self.scan_share, 3)

    def _judge(self, expected: Any, out: Any, before: Sequence[Any]) -> str | None:
        """Why `out` is wrong against eager's `expected` (None: it is right): near eager by
        the recorded error first, then the float64 rule on `before` (the call's inputs)."""
        if self.fp64 and self.recorded is not None:
            quick = compare(
                expected,
                out,
                self.tolerances,
                reductions=self.reductions,
                recorded=self.recorded,
            )
            if quick.reason is None:
                return None
        fp64 = None
        if self.fp64:
            self.stats.float64 += 1
            with torch.no_grad():
                fp64 = self._run_fp64(before)
        verdict = compare(expected, out, self.tolerances, fp64=fp64, reductions=self.reductions)
        return verdict.reason

    def _run_fp64(self, args: Sequence[Any]) -> Any:
        """The graph in float64 on `args` (the copy built at the first re-verification)."""
        try:
            with self._lock:
                if self._fp64_gm is None:
                    self._fp64_gm = fp64_graph(self.gm)
            return self._fp64_gm(*fp64_inputs(args))
        except Exception as exc:  # as at selection: the reason is kept, tolerances are used
            note = f"no float64 reference at run time ({type(exc).__name__}): dtype tolerances"
            if note not in self.stats.unchecked:
                self.stats.unchecked.append(note)
            self.fp64 = False
            return None


def _restored(args: Sequence[Any], held: dict[int, torch.Tensor]) -> str | None:
    """Why the winner is wrong when it changed activations eager leaves alone (their values
    are put back first, so the next backend answers this call on the caller's inputs)."""
    changed = [i for i, before in held.items() if not unchanged(before, args[i])]
    if not changed:
        return None
    with torch.no_grad():
        for i in changed:  # behind the counter, as it was written: the caller sees no write
            args[i].data.copy_(held[i])
    return f"wrote input(s) {changed} where eager does not (no version counter moved; restored)"
