"""Outcomes as data: one graph's record (its attempts: chain.report.attempts)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from chain.judge.race import RaceStats
from chain.report import json_fields as jf
from chain.report.attempts import (
    FAILURES,
    FASTER,
    REFERENCE,
    SLOWER,
    TIED,
    UNDECIDED,
    Attempt,
    Status,
    TimingEvidence,
    merged_evidence,
    number,
)
from chain.report.bucket_stats import BucketStats
from chain.run.watch.stats import RunChecks

__all__ = [
    "FAILURES",
    "FASTER",
    "REFERENCE",
    "SLOWER",
    "TIED",
    "UNDECIDED",
    "Attempt",
    "GraphRecord",
    "Status",
    "TimingEvidence",
    "merged_evidence",
    "number",
]


@dataclass(frozen=True)
class GraphRecord:
    """One graph dynamo handed over: where it came from, what is in it, who ran it."""

    id: int
    fingerprint: str
    origin: str
    num_nodes: int
    ops: dict[str, int]
    inputs: list[dict[str, Any]]
    attempts: tuple[Attempt, ...]
    winner: str | None
    eager_ms: float | None = None
    eager_spread_ms: float | None = None  # half-width of the 99% confidence interval
    notes: tuple[str, ...] = ()
    compile_id: str | None = None  # dynamo's "frame/compile" ("0/1": frame 0, a recompile)
    recompiles: int | None = None  # the earlier graph of the same frame this one replaces
    recompile_reason: str | None = None  # dynamo's failed guard, when it says
    # the graph module as Python source (a `Repro` nn.Module, as dynamo's minifier writes
    # it) and where each backend that is a plain callable imports from ("module:name"; for
    # a function of the user's script, "/abs/path/script.py:name": chain.select.resolve):
    # what `python -m chain repro` needs to rerun one backend on this graph elsewhere
    code: str | None = None
    sources: dict[str, str] = field(default_factory=dict)
    watch: RunChecks | None = None  # what the run-time checks did (chain.run.watch); live counts
    buckets: BucketStats | None = None  # its per-shape buckets (chain.run.buckets); live counts
    race: RaceStats | None = None  # selection going on while it serves (chain.judge.race); live

    @property
    def winning_attempt(self) -> Attempt | None:
        """The attempt that won (the last one with that status, after any runtime fallback)."""
        won = [a for a in self.attempts if a.status is Status.WON]
        return won[-1] if won else None

    @property
    def timing(self) -> TimingEvidence | None:
        """The evidence of every timing run behind this graph's figures, as one."""
        return merged_evidence(self.attempts)

    @property
    def noisy(self) -> bool:
        """Its speed figures may not hold (a busy machine, a wide spread): see `timing`."""
        timing = self.timing
        return timing is not None and bool(timing.noisy)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "fingerprint": self.fingerprint,
            "origin": self.origin,
            "num_nodes": self.num_nodes,
            "ops": dict(self.ops),
            "inputs": list(self.inputs),
            "winner": self.winner,
            "eager_ms": self.eager_ms,
            "eager_spread_ms": self.eager_spread_ms,
            "notes": list(self.notes),
            "compile_id": self.compile_id,
            "recompiles": self.recompiles,
            "recompile_reason": self.recompile_reason,
            "watch": self.watch.to_dict() if self.watch is not None else None,
            # derived from the attempts' evidence (read back from them, not from here)
            "timing": self.timing.to_dict() if self.timing is not None else None,
            "noisy": self.noisy,
            "buckets": self.buckets.to_dict() if self.buckets is not None else None,
            "race": self.race.to_dict() if self.race is not None else None,
            "attempts": [a.to_dict() for a in self.attempts],
            "sources": dict(self.sources),
            "code": self.code,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GraphRecord:
        """The record `to_dict` wrote; a field of the wrong type is a TypeError naming it."""
        data = jf.mapping(data, "a graph record")
        graph = f"graph {jf.integer(data['id'], 'a graph record: id')}"
        ops = jf.mapping(data["ops"], f"{graph}: ops")
        return cls(
            id=int(data["id"]),
            fingerprint=jf.text(data["fingerprint"], f"{graph}: fingerprint"),
            origin=jf.text(data["origin"], f"{graph}: origin"),
            num_nodes=jf.integer(data["num_nodes"], f"{graph}: num_nodes"),
            ops={k: jf.integer(v, f"{graph}: ops[{k!r}]") for k, v in ops.items()},
            inputs=jf.array(data["inputs"], f"{graph}: inputs"),
            attempts=tuple(
                Attempt.from_dict(a) for a in jf.array(data["attempts"], f"{graph}: attempts")
            ),
            winner=jf.optional_text(data["winner"], f"{graph}: winner"),
            eager_ms=number(data.get("eager_ms"), f"{graph}: eager_ms"),
            eager_spread_ms=number(data.get("eager_spread_ms"), f"{graph}: eager_spread_ms"),
            notes=jf.texts(data.get("notes", []), f"{graph}: notes"),
            compile_id=jf.optional_text(data.get("compile_id"), f"{graph}: compile_id"),
            recompiles=jf.optional_integer(data.get("recompiles"), f"{graph}: recompiles"),
            recompile_reason=jf.optional_text(
                data.get("recompile_reason"), f"{graph}: recompile_reason"
            ),
            code=jf.optional_text(data.get("code"), f"{graph}: code"),
            sources={
                str(k): jf.text(v, f"{graph}: sources[{k!r}]")
                for k, v in jf.mapping(data.get("sources") or {}, f"{graph}: sources").items()
            },
            watch=RunChecks.from_dict(data.get("watch")),
            buckets=BucketStats.from_dict(data.get("buckets")),
            race=RaceStats.from_dict(data.get("race")),
        )

    def __str__(self) -> str:
        lines = [f"graph {self.id} ({self.origin}, {self.num_nodes} nodes): {self.winner}"]
        if self.recompiles is not None:
            lines.append(f"  recompiles graph {self.recompiles}: {self.recompile_reason}")
        lines += [f"  {a}" for a in self.attempts]
        if self.buckets is not None:
            lines += [f"  bucket {b}" for b in self.buckets.buckets]
        if self.race is not None:
            lines.append(f"  {self.race}")
        return "\n".join(lines)
