"""What the shape buckets of one graph did: one entry per hot shape, kept on its record."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from chain.judge.race import RaceStats
from chain.report.attempts import Attempt, Status, merged_evidence

# an entry's state: serving its shape, lost to the general path, evicted, or demoted
SERVING, LOST, EVICTED, DEMOTED = "serving", "lost", "evicted", "demoted"
# compiled and verified, racing the general path that serves its shape (chain.run.buckets.racing)
CHALLENGING = "challenging"
GENERAL = "general:"  # the prefix of the general path's attempt in a bucket's attempts


@dataclass
class Bucket:
    """One hot shape: who serves it and how much faster than the general path."""

    shape: str  # the sizes that key it, as "s0=16, input l_x_ (2, 16)"
    state: str  # SERVING, CHALLENGING, LOST, EVICTED or DEMOTED
    winner: str | None  # the fixed-shape backend that serves it (None: the general path)
    general: str  # the general path's backend it was timed against
    calls: int = 0  # calls it served (live while SERVING)
    before: int = 0  # calls of its shape counted before it was built
    latency_ms: float | None = None
    general_ms: float | None = None
    speedup: float | None = None  # general path latency / the bucket's, on this shape
    mb: float | None = None  # CUDA memory its artefact keeps (chain.run.buckets.footprint)
    reason: str = ""  # why it lost, was evicted or demoted
    attempts: list[Attempt] = field(default_factory=list)
    # decided in an earlier process (chain.memory): {decided_at, host, pid}; None: here
    remembered: dict[str, Any] | None = None
    # its run-time race against the general path when its timing did not decide (live)
    race: RaceStats | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("attempts", "race")}
        out["attempts"] = [a.to_dict() for a in self.attempts]
        out["race"] = self.race.to_dict() if self.race is not None else None
        return out

    @classmethod
    def from_dict(cls, data: Any) -> Bucket:
        """The entry `to_dict` wrote; TypeError on a wrong type."""
        if not isinstance(data, dict):
            raise TypeError(f"a bucket should be an object, got {type(data).__name__}")
        kw = {k: data[k] for k in ("shape", "state", "winner", "general") if k in data}
        for k in ("calls", "before", "latency_ms", "general_ms", "speedup", "mb", "reason",
                  "remembered"):  # fmt: skip
            if k in data:
                kw[k] = data[k]
        kw["attempts"] = [Attempt.from_dict(a) for a in data.get("attempts", [])]
        kw["race"] = RaceStats.from_dict(data.get("race"))
        return cls(**kw)

    @property
    def noisy(self) -> tuple[str, ...]:
        """Why the timing behind this bucket's decision may not hold (empty: it holds)."""
        evidence = merged_evidence(self.attempts)
        return evidence.noisy if evidence is not None else ()

    def __str__(self) -> str:
        who = self.winner or f"general path ({self.general})"
        text = f"{self.shape}: {self.state}, {who}, {self.calls} call(s)"
        if self.speedup is not None:
            text += f", {self.speedup:.2f}x over the general path"
        if self.remembered is not None:
            text += f", remembered from {self.remembered.get('decided_at', '?')}"
        if self.race is not None:
            text += f", {race_text(self.race)}"
        return f"{text}: {self.reason}" if self.reason else text


@dataclass
class BucketStats:
    """A graph's buckets (mutable: the guard counts calls as they are served)."""

    bucket_after: int
    max_buckets: int
    candidates: list[str] = field(default_factory=list)  # the fixed-shape backends tried
    buckets: list[Bucket] = field(default_factory=list)
    max_bucket_mb: float | None = None  # bound on the serving buckets' measured memory

    def to_dict(self) -> dict[str, Any]:
        return {
            "bucket_after": self.bucket_after,
            "max_buckets": self.max_buckets,
            "candidates": list(self.candidates),
            "buckets": [b.to_dict() for b in self.buckets],
            "max_bucket_mb": self.max_bucket_mb,
        }

    @classmethod
    def from_dict(cls, data: Any) -> BucketStats | None:
        """The stats `to_dict` wrote (None when absent); TypeError on a wrong type."""
        if data is None:
            return None
        if not isinstance(data, dict):
            raise TypeError(f"buckets should be an object or null, got {type(data).__name__}")
        return cls(
            bucket_after=int(data["bucket_after"]),
            max_buckets=int(data["max_buckets"]),
            candidates=[str(c) for c in data.get("candidates", [])],
            buckets=[Bucket.from_dict(b) for b in data.get("buckets", [])],
            max_bucket_mb=data.get("max_bucket_mb"),
        )

    def compiles(self) -> int:
        """How many compiles the buckets cost in this process: the fixed-shape candidates
        tried (a remembered bucket: its winner alone), unavailable ones and the general
        path's timing entry excepted."""
        skipped = (Status.UNAVAILABLE, Status.NOT_TRIED)
        return sum(
            1
            for b in self.buckets
            for a in b.attempts
            if a.status not in skipped and not a.backend.startswith(GENERAL)
        )

    def serving(self) -> list[Bucket]:
        """The buckets now serving their shape."""
        return [b for b in self.buckets if b.state == SERVING]


def race_text(race: RaceStats) -> str:
    """A bucket's race against the general path in a few words: `provisional: inductor
    serves, 6 pair(s); call 340: general:inductor retired (...)`."""
    text = f"{race.state}: {race.server} serves, {race.pairs} pair(s)"
    return text + (f"; {race.events[-1]}" if race.events else "")
