"""Buckets kept with a graph's remembered decision (chain.memory): each hot shape's key, who
served it (or that the general path kept it) and the figures, so that a new process
compiles the remembered winner of a shape on its first sight (verified against eager, not
timed) instead of counting calls to `bucket_after` and timing every candidate again.

Stored form, one object per shape: {"key", "shape", "state", "winner", "general",
"general_package", "latency_ms", "general_ms", "speedup", "reason", "decided_at", "host",
"pid"}. `general_package`: the general path it was timed against ran inductor's package,
not its JIT compile (2-3x apart on a small BERT): a process whose general path runs the
other form decides the shape again.
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass
from typing import Any

from chain.report.bucket_stats import LOST, SERVING, Bucket
from chain.run.buckets.shapes import Key, ShapeKey

FIGURES = ("latency_ms", "general_ms", "speedup")


@dataclass(frozen=True)
class Remembered:
    """A shape's bucket as decided in an earlier process."""

    key: Key
    entry: dict[str, Any]  # the stored form, written back as it was

    @property
    def state(self) -> str:
        return str(self.entry["state"])

    @property
    def winner(self) -> str | None:
        return self.entry.get("winner")

    def where(self) -> dict[str, Any]:
        """When and where it was decided: the bucket's `remembered` field."""
        return {k: self.entry.get(k) for k in ("decided_at", "host", "pid")}

    def bucket(self, shape: str) -> Bucket:
        """Its record in this process, with the decision's figures (nothing timed here)."""
        return Bucket(
            shape=shape,
            state=self.state,
            winner=self.winner,
            general=str(self.entry["general"]),
            reason=str(self.entry.get("reason") or ""),
            remembered=self.where(),
            **{k: self.entry.get(k) for k in FIGURES},
        )


def from_package(fn: Any) -> bool:
    """Whether a general path's callable runs a package (its `chain_details` say so)."""
    details = getattr(fn, "chain_details", None)
    return isinstance(details, dict) and details.get("from_package") is True


def entry(bucket: Bucket, key: Key, shapes: ShapeKey, package: bool) -> dict[str, Any] | None:
    """The stored form of a bucket decided in this process against a general path that
    ran a package (`package`) or not; None for one that decides nothing for a later process
    (evicted, demoted, or eager's reference could not run)."""
    if bucket.state not in (SERVING, LOST) or not bucket.attempts:
        return None
    return {
        "key": shapes.encode(key),
        "shape": bucket.shape,
        "state": bucket.state,
        "winner": bucket.winner,
        "general": bucket.general,
        "general_package": package,
        **{k: getattr(bucket, k) for k in FIGURES},
        "reason": bucket.reason,
        "decided_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }


def load(
    data: Any, shapes: ShapeKey, general: str, package: bool = False
) -> tuple[dict[Key, Remembered], list[str]]:
    """The stored buckets that fit this graph and were timed against the general winner it
    has now, in the same form (`package`: its package, not its JIT compile), by key; a note
    for each one refused (unreadable, another general path)."""
    if data is None:
        return {}, []
    if not isinstance(data, list):
        return {}, [f"memory: buckets ignored: a list expected, got {type(data).__name__}"]
    out: dict[Key, Remembered] = {}
    notes = []
    for item in data:
        try:
            if not isinstance(item, dict):
                raise ValueError(f"an object expected, got {type(item).__name__}")
            key = shapes.decode(item.get("key"))
            if item.get("state") not in (SERVING, LOST):
                raise ValueError(f"state {item.get('state')!r}")
            if item.get("state") == SERVING and not isinstance(item.get("winner"), str):
                raise ValueError(f"winner {item.get('winner')!r}")
        except ValueError as e:
            notes.append(f"memory: a remembered bucket ignored ({e})")
            continue
        if item.get("general") != general:
            notes.append(
                f"memory: bucket {item.get('shape')} ignored: timed against the general path "
                f"{item.get('general')}, which is {general} now"
            )
            continue
        if bool(item.get("general_package", False)) != package:
            forms = ("its JIT compile", "its package")
            notes.append(
                f"memory: bucket {item.get('shape')} ignored: timed against {general}'s "
                f"{forms[not package][4:]}, which runs {forms[package]} now"
            )
            continue
        out[key] = Remembered(key, item)
    return out, notes
