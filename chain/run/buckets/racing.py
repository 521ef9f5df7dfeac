"""A bucket whose timing against the general path did not decide (undecided, or noisy: a busy
machine) is not refused: it races the general path on sampled calls of its shape, by the
graph race's rules (chain.judge.race: sign test, hysteresis, cost bound) and pairs
(chain.run.race.Racer: same inputs, the server timed first as it serves, answers compared).

The bucket serves first unless the general path led the build's timing by more than the tie
band (3%); the race promotes the other when it is faster with confidence, and ends once the
one not serving retires on quiet evidence (decided: remembered with the graph's decision) or
fails (raised, or the two answered differently: the general path serves the shape from then
on).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from chain.judge.race import Race, RaceEvent
from chain.report.bucket_stats import CHALLENGING, DEMOTED, GENERAL, LOST, SERVING, Bucket
from chain.run.race import DIFFERED, NOT_RACED, Raced, Racer
from chain.run.watch import Watch

Fn = Callable[..., Any]


class ShapeRace:
    """One hot shape's bucket raced against the general path: who serves it now, and the
    pairs that decide. `on_event(race, event)`: the buckets record it (and settle an ended
    race: the shape's entry kept, or dropped)."""

    __slots__ = ("bucket", "fn", "name", "on_event", "path", "racer", "serving", "watch")

    def __init__(
        self,
        bucket: Bucket,
        fn: Fn,
        general: Callable[[], Fn],
        lead: bool,
        tolerances: dict[torch.dtype, tuple[float, float]] | None,
        inputs: list[Any],
        on_event: Callable[[ShapeRace, RaceEvent], None],
    ) -> None:
        name = bucket.winner
        if name is None:
            raise ValueError("a raced bucket needs its fixed-shape winner")
        self.bucket, self.fn, self.name = bucket, fn, name
        self.path = f"{GENERAL}{bucket.general}"
        self.serving = lead  # the bucket serves (else the general path, the bucket challenging)
        self.watch: Watch | None = None  # the bucket's run-time checks, while it serves
        self.on_event = on_event
        server, challenger = (name, self.path) if lead else (self.path, name)
        race = Race(server, [challenger], provisional=True)
        bucket.race = race.stats
        bucket.state = SERVING if lead else CHALLENGING
        fns = {name: fn, self.path: lambda *args: general()(*args)}  # the guard's path now
        cuda = any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs)
        # a bucket's graph writes none of its inputs (chain.run.buckets): nothing to copy
        self.racer = Racer(race, fns, (), self._event, tolerances, cuda)

    @property
    def race(self) -> Race:
        return self.racer.race

    def pick(self, args: tuple[Any, ...], general: Fn) -> tuple[Fn, Watch | None] | Raced | None:
        """This call of the shape: a pair when one is due (`Raced`), else the bucket and its
        checks while it serves, None while the general path (`general`) serves."""
        challenger = self.racer.race.due()
        if challenger is not None:
            serving = self.serving
            out = self.racer.run_server(self.fn if serving else general, challenger, args)
            if out is not NOT_RACED:
                if serving:
                    self.bucket.calls += 1
                return Raced(out)
        if not self.serving:
            return None
        self.bucket.calls += 1
        return self.fn, self.watch

    def _event(self, event: RaceEvent, _: Fn | None) -> None:
        """The bucket's state after `event`: who serves, and why."""
        race, bucket = self.racer.race, self.bucket
        self.serving = race.stats.server == self.name
        failed = event.what == "dropped" and (event.backend == self.name or DIFFERED in event.why)
        if failed:  # it raised or answered wrong, or the two disagree: the general path serves
            self.serving = False
            bucket.state, bucket.reason = DEMOTED, f"in the run-time race: {event}"
        elif race.over:
            bucket.state = SERVING if self.serving else LOST
            bucket.winner = self.name if self.serving else None  # who serves the shape
            verb = "kept by" if self.serving else "lost"
            bucket.reason = f"{verb} the run-time race against the general path: {event}"
        else:
            bucket.state = SERVING if self.serving else CHALLENGING
            bucket.reason = f"provisional, raced against the general path: {event}"
        self.on_event(self, event)

    def stop(self) -> None:
        """The bucket left its shape otherwise (demoted by its checks, evicted): no more pairs."""
        self.serving = False
        self.racer.race.stats.state = "ended"
