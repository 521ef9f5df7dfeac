"""One selection per graph in a process: a graph a chain already selected is not selected
again when dynamo hands it over once more (a cold burst of first calls from several
threads compiles the frame once per thread that missed its cache; recompiles of the same
graph too). The later compile reuses the decision as a remembered one (chain.memory):
only its winner compiled and verified, nothing timed, the same winner for every thread.

The key is the decision store's (chain.memory.key: graph, input specs, chain options,
environment). A compile of a key waits while another thread selects it: dynamo already
holds its process-wide compile lock over every backend call, so the threads whose first
calls missed the cache are blocked in dynamo (not served by eager) until the selection
ends; the per-key lock here covers chains called outside dynamo's lock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import socket
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from torch import fx

from chain.memory import Decision, Recall
from chain.memory.key import digest, key_parts
from chain.report.report import Report


@dataclasses.dataclass(frozen=True)
class Reused(Recall):
    """A decision this chain made earlier in this process, for graph `graph`."""

    graph: int = -1


@dataclasses.dataclass
class Turn:
    """One compile's place in line for its key: `recall` hands it the decision made
    earlier in this process where the store has none; `decided` records its own."""

    once: Once
    key: str
    parts: dict[str, Any]

    def recall(self, found: Recall | None, report: Report) -> Recall | None:
        """`found` (the store's lookup) when it holds a decision; else this process's
        earlier decision for the key, as a `Reused` recall; else `found`."""
        if found is not None and found.decision is not None:
            return found
        graph, fingerprint = self.once.decided.get(self.key, (-1, ""))
        record = report.graphs[graph] if 0 <= graph < len(report.graphs) else None
        if record is None or record.fingerprint != fingerprint or record.winner is None:
            return found  # none, or the report was replaced: select
        decision = Decision(
            winner=record.winner,
            attempts=record.attempts,
            eager_ms=record.eager_ms,
            eager_spread_ms=record.eager_spread_ms,
            decided_at=self.once.when.get(self.key, ""),
            host=socket.gethostname(),
            pid=os.getpid(),
        )
        note = (
            f"same graph and inputs as graph {record.id}, selected by this chain in this "
            f"process: its decision reused ({record.winner}), one selection per graph"
        )
        notes = (*(found.notes if found is not None else ()), note)
        return Reused(self.key, self.parts, decision, notes, graph=record.id)

    def decided(self, graph: int, report: Report) -> None:
        """Graph `graph` compiled under this key: later compiles of the key reuse its
        decision (a reuse leaves the first in place: its record holds the selection)."""
        record = report.graphs[graph]
        if self.key in self.once.decided or record.winner is None:
            return
        self.once.decided[self.key] = (graph, record.fingerprint)
        self.once.when[self.key] = datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"
        )


class Once:
    """A chain's decisions in this process, by key, and one lock per key in selection."""

    def __init__(self, chain: Mapping[str, Any]) -> None:
        self.chain = dict(chain)
        # key -> (the graph whose selection decided it, its fingerprint)
        self.decided: dict[str, tuple[int, str]] = {}
        self.when: dict[str, str] = {}
        self._lock = threading.Lock()
        self._keys: dict[str, threading.RLock] = {}

    @contextlib.contextmanager
    def turn(self, gm: fx.GraphModule, inputs: Sequence[Any]) -> Iterator[Turn]:
        """The compile of `gm` on `inputs`, one at a time per key (re-entrant: a chain
        nested in itself on one thread does not wait on itself)."""
        parts = key_parts(gm, inputs, self.chain)
        key = digest(parts)
        with self._lock:
            lock = self._keys.setdefault(key, threading.RLock())
        with lock:
            yield Turn(self, key, parts)
