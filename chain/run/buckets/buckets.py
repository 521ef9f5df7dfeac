"""Per-shape buckets: a graph with symbolic sizes keeps its general winner, and each shape
that turns hot gets the chain's fixed-shape candidates compiled for it, verified and timed
against the general path like any candidate; the fastest serves that shape if it beats it.

The guard asks `pick` on every call: one key built from the call's sizes and one dict
lookup. Counting, building, eviction and demotion happen here; what to build with (the
reference run, one attempt, the speed rules) comes from the chain as a `Selection`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Sequence
from typing import Any

from torch import fx

import chain.run.buckets.footprint as footprint
import chain.run.buckets.verdict as judged
from backends.errors import one_line
from chain.judge.race import RaceEvent
from chain.judge.timing import TIE_BAND, compare
from chain.report.bucket_stats import (
    CHALLENGING,
    DEMOTED,
    EVICTED,
    GENERAL,
    LOST,
    SERVING,
    Bucket,
    BucketStats,
)
from chain.report.records import Attempt, Status
from chain.run.buckets.given import Fn, General, Selection
from chain.run.buckets.racing import ShapeRace
from chain.run.buckets.remembered import Remembered, entry
from chain.run.buckets.shapes import Key, ShapeKey, specialize
from chain.run.buckets.timed_against import TimedAgainst
from chain.run.callers import CALLERS, may_trace
from chain.run.race import Raced
from chain.run.watch import Watch
from chain.select.timed import time_candidates

log = logging.getLogger("chain")

MAX_SEEN = 1024  # shapes counted at once; past it the counts restart (a flood of cold shapes)
QUIET_S = 120.0  # a bucket's timing waits this long for other compiles to end (seen: 35-50 s)
BUDGET_S = 0.5  # a bucket's timing budget at least (undecided: up to 5x, as any timing)


class Buckets:
    """One graph's buckets: counts calls per shape, builds hot ones, serves the winners.

    Thread safety: counts are plain dict writes (a lost increment only delays a build); one
    build at a time per graph, taken without waiting, so calls made meanwhile (and every
    other shape) run the general path.
    """

    def __init__(
        self,
        gm: fx.GraphModule,
        key: ShapeKey,
        stats: BucketStats,
        selection: Selection,
        remembered: dict[Key, Remembered] | None = None,
    ) -> None:
        self.gm = gm
        self.key = key
        self.stats = stats
        self.selection = selection
        self.after = stats.bucket_after
        # the shape's bucket, its checks, and its race against the general path (None: decided)
        self.served: dict[Key, tuple[Fn, Bucket, Watch | None, ShapeRace | None]] = {}
        self.seen: dict[Key, int] = {}
        # calls of a built shape since its build, whoever served them: a bucket that is
        # challenging (the general path serves while they race) is as used as its shape
        self.hits: dict[Key, int] = {}
        self.done: set[Key] = set()  # shapes not to build again: lost or demoted
        self.against = TimedAgainst()  # served only while the general path is unchanged
        self.building = threading.Lock()
        # decided in an earlier process: built on a shape's first sight (chain.memory)
        self.remembered = dict(remembered or {})
        self.kept = {k: r.entry for k, r in self.remembered.items()}  # what the store holds

    def pick(
        self, args: tuple[Any, ...], general: General
    ) -> tuple[Fn, Watch | None] | Raced | None:
        """The bucket's callable and its run-time checks for this call's shape, None for the
        general path, or a raced call's answer (`Raced`: both ran, chain.run.buckets.racing)."""
        key = self.key(args)
        entry = self.served.get(key)
        if entry is not None and self.against.stale(key):
            self._retire(key)
            entry = None
        if entry is not None:
            self.hits[key] = self.hits.get(key, 0) + 1
            if entry[3] is not None:
                return entry[3].pick(args, general.fn)
            entry[1].calls += 1
            return entry[0], entry[2]
        n = self.seen.get(key, 0) + 1
        if n == 1 and len(self.seen) >= MAX_SEEN:
            self.seen.clear()
        self.seen[key] = n
        if key in self.done:
            return None
        if key in self.remembered and (n == 1 or n % self.after == 0):
            self._build(key, n, args, general)
            return None  # as for a bucket built here: this call takes the general path
        if n % self.after:
            return None
        self._build(key, n, args, general)
        return None  # the call that built it takes the general path

    def general_switched(self, winner: str) -> None:
        """The general path now runs `winner`'s callable: each serving bucket is retired at
        its shape's next call, and the shape decided again once hot (`GuardedGraph.switch`)."""
        self.against.switched(winner)

    def _retire(self, key: Key) -> None:
        """Stop serving `key`'s bucket, timed against a general path that no longer serves;
        the store forgets its decision (a new one is kept once decided again)."""
        self._evict(
            key,
            f"retired: the general path switched to {self.against.switched_to} after this "
            "bucket was timed against it (re-decided when hot again)",
        )
        self.against.forget(key)
        if self.kept.pop(key, None) is not None:
            self._keep()
        self.selection.saved()

    def demote(self, args: Sequence[Any], exc: Exception) -> None:
        """The bucket of this call's shape raised or was caught wrong (`Demoted`): the general
        path serves the shape from now on (recorded; raised again under strict)."""
        key = self.key(args)
        entry = self.served.pop(key, None)
        if entry is not None:
            if entry[3] is not None:
                entry[3].stop()
            bucket = entry[1]
            bucket.state, bucket.reason = DEMOTED, f"at run time: {one_line(exc)}"
            self.done.add(key)
            log.warning("bucket %s (%s) failed at run time (%s); the general path serves it",
                        bucket.shape, bucket.winner, one_line(exc))  # fmt: skip
            if self.kept.pop(key, None) is not None:
                self._keep()
            self.selection.saved()
        if self.selection.strict:
            raise exc

    def _build(self, key: Key, n: int, args: Sequence[Any], general: General) -> None:
        """Build this shape's bucket unless another build runs; evict the least used when
        full (only for a shape called more often than it)."""
        if not self.building.acquire(blocking=False):
            return
        try:
            if key in self.served or key in self.done:
                return
            self.against.timing(key, general.fn)
            served = list(self.served.items())  # a snapshot: demote() pops without the lock
            uses = {k: self._uses(k) for k, _ in served}
            victim = min(served, key=lambda kv: uses[kv[0]], default=None)
            full = len(self.served) >= self.stats.max_buckets
            bound = self.stats.max_bucket_mb
            if bound is not None and self.served:  # a new one as large as the largest
                full = (
                    full
                    or self._mb() + max(b.mb or 0.0 for _, b, *_ in self.served.values()) > bound
                )
            if full and victim is not None and uses[victim[0]] >= n:
                return  # the least used bucket is used as much: try again later
            if not may_trace():  # building traces the graph: not beside other threads
                self._unbuilt(key, n, args, general.winner, CALLERS.why_not())
                return
            bucket, fn = self._recalled(key, args, general)
            fresh, race = bucket is None, None
            if bucket is None:
                bucket, fn, race = self._select(key, args, general)
            bucket.before = n
            self.stats.buckets.append(bucket)
            if fn is not None and bound is not None and (bucket.mb or 0.0) > bound:
                bucket.state, bucket.winner, bucket.race, race = LOST, None, None, None
                bucket.reason = (
                    f"its artefact, {bucket.mb:.1f} MiB, exceeds max_bucket_mb {bound:g}"
                )
                fn = None
            if race is not None:  # remembered once the race decides on quiet evidence
                log.info("bucket %s: %s", bucket.shape, bucket.reason)
            elif fresh and (why := self._not_decided(bucket)) is not None:
                log.info("bucket %s: %s", bucket.shape, why)  # its attempts show the noise
            elif fresh and (stored := self._entry(bucket, key)) is not None:
                self.kept[key] = stored  # decided here: kept with the graph's decision
                self._keep()
            if fn is None:
                self.done.add(key)
            else:
                if len(self.served) >= self.stats.max_buckets and victim is not None:
                    self._evict(victim[0], f"least used of {self.stats.max_buckets} (max_buckets)")
                watch = general.bucket_watch(bucket.winner or "", fn)
                if race is not None:
                    race.watch = watch
                self.served[key] = (fn, bucket, watch, race)
                while bound is not None and (total := self._mb()) > bound and len(self.served) > 1:
                    others = [k for k in self.served if k != key]
                    least = min(others, key=self._uses)
                    self._evict(least, f"least used; {total:.1f} MiB over max_bucket_mb {bound:g}")
            self.selection.saved()
            return
        finally:
            self.building.release()

    def _unbuilt(self, key: Key, n: int, args: Sequence[Any], general: str, why: str) -> None:
        """`key` turned hot but is not built (`why`): the general path serves it, said once."""
        shape = self.key.describe(args)
        bucket = Bucket(shape, LOST, None, general, before=n, reason=f"not built: {why}")
        self.stats.buckets.append(bucket)
        self.done.add(key)
        log.info("bucket %s not built: %s", shape, why)

    def _entry(self, bucket: Bucket, key: Key) -> dict[str, Any] | None:
        """The stored form of `key`'s bucket decided here (chain.run.buckets.remembered)."""
        return entry(bucket, key, self.key, self.against.package(key))

    def _uses(self, key: Key) -> int:
        """How used a built shape is: its calls before the build and since, whoever served."""
        entry = self.served.get(key)
        return (entry[1].before if entry is not None else 0) + self.hits.get(key, 0)

    def _not_decided(self, bucket: Bucket) -> str | None:
        """Why a bucket decided here is not remembered: under the eager floor, its timing
        was noisy (a later process would serve a figure that may not hold)."""
        noisy = bucket.noisy
        if not self.selection.speed.eager_floor or not noisy:
            return None
        return f"not remembered: noisy timing ({'; '.join(noisy)})"

    def _mb(self) -> float:
        """The measured memory of the serving buckets (MiB; unmeasured ones count 0)."""
        return sum(b.mb or 0.0 for _, b, *_ in self.served.values())

    def _evict(self, key: Key, reason: str) -> None:
        """Stop serving `key`'s bucket: its shape is counted afresh and may be built again."""
        self.hits.pop(key, None)
        entry = self.served.pop(key, None)
        if entry is None:
            return  # demoted meanwhile (demote() takes no lock): nothing left to evict
        _, old, _, race = entry
        if race is not None:
            race.stop()
        self.seen.pop(key, None)
        old.state, old.reason = EVICTED, reason

    def _keep(self) -> None:
        """Hand the bucket decisions to the decision store, if it is on."""
        if self.selection.kept is not None:
            self.selection.kept(list(self.kept.values()))

    def _recalled(
        self, key: Key, args: Sequence[Any], general: General
    ) -> tuple[Bucket | None, Fn | None]:
        """A remembered bucket built alone: its winner compiled and verified against eager
        now, the decision's figures kept. (None, None) when none is remembered for the
        shape, or its winner cannot be built now (logged; the shape is then selected anew)."""
        rem = self.remembered.pop(key, None)
        if rem is None:
            return None, None
        shape = self.key.describe(args)
        bucket = rem.bucket(shape)
        if rem.state != SERVING:
            return bucket, None  # the general path kept this shape: nothing to build
        sel, inputs = self.selection, list(args)
        backend = next((b for b in sel.candidates(general.winner) if b.name == rem.winner), None)
        reference, _ = sel.reference(self.gm, inputs)
        if backend is None or reference.outputs is None or not reference.runnable:
            why = "not a candidate now" if backend is None else "eager's reference could not run"
            log.warning("remembered bucket %s (%s) not built: %s", shape, rem.winner, why)
            self.kept.pop(key, None)
            return None, None
        special = specialize(self.gm)
        (attempt, fn), bucket.mb = footprint.measured(
            inputs, lambda: sel.attempt(backend, special, inputs, reference)
        )
        where = {**rem.where(), "compiled": True}
        bucket.attempts = [
            dataclasses.replace(attempt, details={**attempt.details, "remembered": where})
        ]
        if fn is None:
            log.warning("remembered bucket %s: %s failed now (%s: %s); selected anew",
                        shape, rem.winner, attempt.status, attempt.reason)  # fmt: skip
            self.kept.pop(key, None)
            return None, None
        return bucket, fn

    def _select(
        self, key: Key, args: Sequence[Any], general: General
    ) -> tuple[Bucket, Fn | None, ShapeRace | None]:
        """Compile, verify and time the fixed-shape candidates for this call's sizes against
        the general path; the fastest serves the shape if it beats it by 1%. Where that
        timing did not decide (undecided, or noisy), the fastest races the general path at
        run time (chain.run.buckets.racing): the bucket serves first unless the general path was
        faster at the median by more than the tie band (3%)."""
        sel, inputs = self.selection, list(args)
        winner, shape = general.winner, self.key.describe(args)
        bucket = Bucket(shape=shape, state=LOST, winner=None, general=winner)
        reference, _ = sel.reference(self.gm, inputs)
        if reference.outputs is None or not reference.runnable:
            bucket.reason = reference.unverified or "eager's reference could not run"
            return bucket, None, None
        special = specialize(self.gm)
        attempts: list[Attempt] = []
        fns: dict[str, Fn] = {}
        sizes: dict[str, float | None] = {}
        for backend in sel.candidates(winner):
            (attempt, fn), sizes[backend.name] = footprint.measured(
                inputs, lambda b=backend: sel.attempt(b, special, inputs, reference)
            )
            attempts.append(attempt)
            if fn is not None:
                fns[backend.name] = fn
        if not fns:
            bucket.attempts = attempts
            bucket.reason = "no fixed-shape candidate passed"
            return bucket, None, None
        path = f"{GENERAL}{winner}"
        fns[path] = general.fn
        attempts.append(Attempt(path, Status.WON, "the general path (symbolic sizes)"))
        # timed in the chain's harness once no other compile runs (QUIET_S at most), with
        # at least BUDGET_S for a decision: made once per hot shape, after a compile
        budget = max(sel.speed.budget_s, BUDGET_S)
        speed = dataclasses.replace(sel.speed, quiet_s=QUIET_S, budget_s=budget)
        attempts, timings = time_candidates(speed, attempts, fns, self.gm, reference)
        if path not in fns:
            bucket.attempts = attempts
            bucket.reason = "the general path failed while timed on this shape"
            return bucket, None, None
        base = timings[path]
        bucket.general_ms = base.median_ms
        passing = [a for a in attempts if a.backend in fns and a.backend != path]
        best = min(passing, key=lambda a: a.latency_ms or float("inf"), default=None)
        why_not = judged.why_not(best, base, timings, speed)
        versus = compare(base.rounds_s, timings[best.backend].rounds_s) if best else None
        bucket.attempts = attempts  # their evidence: was the timing noisy?
        raced = versus is not None and judged.undecided(versus, bucket.noisy)
        won = best is not None and (why_not is None or raced)
        keep = {path} | ({best.backend} if won and best is not None else set())
        out = [
            a
            if a.backend in keep or a.status is not Status.WON
            else dataclasses.replace(
                a,
                status=Status.SLOWER,
                reason=f"{a.latency_ms:.3f} ms vs the general path's {base.median_ms:.3f} ms"
                + (f": {judged.against(base, timings[a.backend])}" if a.backend in timings else ""),
            )
            for a in attempts
        ]
        bucket.attempts = out
        if not won or best is None or versus is None:
            bucket.reason = why_not or "no fixed-shape candidate passed"
            return bucket, None, None
        bucket.state, bucket.winner = SERVING, best.backend
        bucket.latency_ms = best.latency_ms
        bucket.mb = sizes.get(best.backend)
        bucket.speedup = base.median_ms / best.latency_ms if best.latency_ms else None
        fn = fns[best.backend]
        if not raced:
            return bucket, fn, None
        settle = lambda r, e: self._raced(key, r, e)  # noqa: E731
        # the bucket serves first unless the general path was faster at the median by more
        # than the tie band (a tie is not a loss; the race demotes a slower bucket)
        lead = versus.speedup >= 1.0 - TIE_BAND
        race = ShapeRace(bucket, fn, lambda: general.fn, lead, reference.tolerances, inputs, settle)
        why = "; ".join(bucket.noisy) or f"{versus.verdict}, {versus.interval()}"
        bucket.reason = (
            f"provisional, its timing did not decide ({why}): raced against the general path "
            f"at run time, {race.race.stats.server} serving first"
        )
        return bucket, fn, race

    def _raced(self, key: Key, race: ShapeRace, event: RaceEvent) -> None:
        """An event of `key`'s race (the bucket's state is set): once over, the winner serves
        the shape alone; a race decided on quiet evidence is kept with the graph's decision."""
        served = self.served.get(key)
        if served is not None and served[3] is race and (race.race.over or not race.serving):
            if race.serving:
                self.served[key] = (served[0], served[1], served[2], None)
            elif race.race.over or served[1].state != CHALLENGING:
                self.served.pop(key, None)
                self.done.add(key)
            decided = race.race.stats.state == "decided"
            if decided and (stored := self._entry(race.bucket, key)) is not None:
                self.kept[key] = stored
                self._keep()
        self.selection.saved()
