"""What serves a graph's winner besides its callable: the run-time checks (chain.run.watch)
and the per-shape buckets (chain.run.buckets), built from what selection found."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from backends.registry import Backend
from chain.judge.speed import EAGER
from chain.memory import Memory, Recall
from chain.report import graphinfo
from chain.report.records import GraphRecord
from chain.run.buckets import Buckets, BucketStats, ShapeKey
from chain.run.buckets import Selection as BucketSelection
from chain.run.buckets import remembered as bucket_memory
from chain.run.graphs import base_name
from chain.run.guard import FallBack, GuardedGraph
from chain.run.watch import Expected, RunChecks, Watch, Writes
from chain.run.watch.updates import Updates
from chain.run.watch.weights import Weights
from chain.select.attempt import Reference
from chain.select.candidates import Selected, Selection
from chain.select.isolation import RUN_TIME_PARTS
from chain.select.records import Records

log = logging.getLogger("chain")


@dataclasses.dataclass
class ServingPlan:
    """The serving stage: a graph's winner guarded (chain.run.guard), with its run-time
    checks and weight updates (chain.run.watch) and its per-shape buckets (chain.run.buckets)."""

    selection: Selection  # what buckets select with
    records: Records
    memory: Memory | None  # keeps bucket decisions with the graph's
    watch: bool
    reverify_rate: float
    bucket_after: int | None
    max_buckets: int
    max_bucket_mb: float | None

    def guard(
        self,
        fallback: FallBack,
        record: GraphRecord,
        gm: fx.GraphModule,
        inputs: list[Any],
        reference: Reference,
        selected: Selected,
        recall: Recall | None,
        errors: Sequence[float | None] | None,
    ) -> GuardedGraph:
        """The callable dynamo gets for the graph: its winner guarded, watched (against
        eager's `errors` from float64, else those recorded with its decision) and bucketed;
        `fallback` (the chain) takes a failure at run time."""
        winner = record.winner
        assert winner is not None  # the chain raises AllCandidatesFailed first
        watch_for, updates = self.watch_for(record, gm, reference, errors or reference.recorded)
        kept = recall if self.memory is not None else None
        fn = selected.fns[winner]
        package = bucket_memory.from_package(fn)
        buckets = self.buckets(record.id, gm, inputs, winner, kept, selected.hit, package)
        index = self.selection.index(winner)
        return GuardedGraph(fallback, record.id, gm, fn, index, watch_for, buckets, updates)

    def buckets(
        self,
        graph_id: int,
        gm: fx.GraphModule,
        inputs: list[Any],
        winner: str,
        recall: Recall | None = None,
        hit: bool = False,
        package: bool = False,
    ) -> Buckets | None:
        """Buckets for a graph with symbolic sizes that the chain can verify and time, and
        that has fixed-shape candidates; None otherwise (the guard then costs nothing more).
        Graphs that write their inputs or draw random numbers get none. With the decision
        store on (`recall`), bucket decisions are kept with the graph's decision, and on a
        hit (`hit`) the remembered ones are built on first sight of their shape: those timed
        against the general path in the form it runs now (`package`: inductor's package)."""
        key = ShapeKey(gm, inputs)
        verified = self.selection.verify and self.selection.speed.measure
        if self.bucket_after is None or not verified or not key:
            return None
        if graphinfo.mutates_inputs(gm) or graphinfo.random_nodes(gm):
            return None
        candidates = self._bucket_candidates(winner)
        if not candidates:
            return None
        names = [b.name for b in candidates]
        stats = BucketStats(self.bucket_after, self.max_buckets, names, [], self.max_bucket_mb)
        remembered, notes = {}, []
        if hit and recall is not None and recall.decision is not None:
            remembered, notes = bucket_memory.load(
                recall.decision.extra.get("buckets"), key, winner, package
            )
        if remembered:
            notes.append(f"memory: {len(remembered)} remembered bucket(s), built on first sight")
        self.records.change(graph_id, buckets=stats)
        self.records.note(graph_id, *notes)
        selection = BucketSelection(
            reference=self.selection.reference,
            attempt=lambda b, g, x, r: self.selection.attempt(b, b, g, x, r),
            candidates=self._bucket_candidates,
            speed=self.selection.speed,
            strict=self.selection.speed.strict,
            saved=self.records.save,
            kept=(lambda e: self._keep_buckets(recall, e)) if recall is not None else None,
        )
        return Buckets(gm, key, stats, selection, remembered)

    def _keep_buckets(self, recall: Recall, entries: list[dict[str, Any]]) -> None:
        """Store a graph's bucket decisions with its decision; a warning when not stored."""
        if self.memory is not None and (note := self.memory.remember_buckets(recall, entries)):
            log.warning("%s", note)

    def _bucket_candidates(self, winner: str) -> list[Backend]:
        """What may serve a hot shape: the chain's fixed-shape backends (`dynamic=False`)
        and the general winner compiled for that shape (static inductor), eager excepted."""
        base = base_name(winner)
        backends = self.selection.backends
        return [b for b in backends if not b.dynamic or (b.name == base and base != EAGER)]

    def watch_for(
        self,
        record: GraphRecord,
        gm: fx.GraphModule,
        reference: Reference,
        recorded: Sequence[float | None] | None,
    ) -> tuple[Callable[[str], Watch | None], Updates | None]:
        """The run-time checks for each winner the graph will have (chain.run.watch), from what
        selection found: eager's outputs, the inputs it wrote, whether float64 ran and
        eager's error against it (`recorded`, per output). The counters go on the record."""
        stats = RunChecks(reverify_rate=self.reverify_rate if self.watch else 0.0)
        expected, writes = None, None
        if reference.runs is not None and reference.after:
            writes = Writes.found(
                reference.runs, reference.after, reference.after_base, reference.wrote
            )
        if not self.watch:
            stats.unchecked.append("run-time checks off: watch=False")
        elif reference.outputs is None or reference.runs is None:
            stats.unchecked.append(f"no run-time checks: {reference.unverified}")
        else:
            ran = [reference.after.get(i, x) for i, x in enumerate(reference.runs)]
            watched = [
                i
                for i, x in enumerate(reference.runs)
                if isinstance(x, torch.Tensor) and not isinstance(x, torch.nn.Parameter)
            ]
            expected = Expected(gm, ran, reference.outputs, watched)
            stats.unchecked += expected.unchecked
        self.records.change(record.id, watch=stats)

        weights = None  # the weights as selection leaves them (chain.run.watch.weights)
        isolation = reference.isolation
        if self.watch and isolation is not None and reference.runs is not None:
            # fingerprints in RUN_TIME_PARTS, one per re-verification: a sum over every
            # weight each time cost a tiny BERT's call four times over (its vocabulary)
            runs = reference.runs
            positions = [i for i in isolation.watched if isinstance(runs[i], torch.Tensor)]
            names = [isolation.names[i] for i in positions]
            weights = Weights(positions, names, reference.runs, RUN_TIME_PARTS)
        updates = None  # none without weights: the guard then reads nothing per call
        if weights is not None and weights.positions:
            updates = Updates(weights, stats, self.records.saved_s(record.id))

        # activations: their versions are read every call; the weights' (parameters and
        # buffers) before each call and, with their fingerprints, at each re-verification
        weights_at = set(isolation.watched) if weights is not None and isolation else set()
        activations = [
            i
            for i, x in enumerate(reference.runs or ())
            if isinstance(x, torch.Tensor)
            and not isinstance(x, torch.nn.Parameter)
            and i not in weights_at
        ]

        def watch_for(winner: str) -> Watch | None:
            if base_name(winner) == EAGER or (expected is None and writes is None):
                return None  # eager is the reference itself: nothing to check it against
            return Watch(
                gm,
                expected,
                writes,
                stats,
                reverify_rate=self.reverify_rate if expected is not None else 0.0,
                tolerances=self.selection.tolerances,
                fp64=reference.fp64 is not None or reference.later is not None,
                weights=weights,
                name=winner,  # WeightsDamaged: "<winner>, the winner (at run time, call n)"
                versioned=activations,
                recorded=recorded,
                reductions=reference.reductions,
                # eager takes over a slow winner only as the floor
                pace=self.selection.speed.eager_floor,
            )

        return watch_for, updates
