"""The chain: per graph, try backends in order (or all of them), keep the best that passes."""

from __future__ import annotations

import dataclasses
import logging
import os
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from backends.common.versions import version
from backends.errors import InvalidBackend
from backends.registry import Backend
from chain.judge.accuracy import reduction_lengths, relative_errors
from chain.judge.fp64 import Later, fp64_reference
from chain.judge.speed import EAGER, EAGER_REF, SpeedRules, not_decided
from chain.judge.timing import Timing
from chain.judge.verify import unchanged
from chain.memory import Memory, Recall, enabled_by_env, hit_note, miss_note, replay
from chain.report import graphinfo
from chain.report.look import capture, progress, trace
from chain.report.records import Attempt, GraphRecord, Status
from chain.report.report import Report
from chain.report.report_file import ReportFile
from chain.run.buckets import Buckets, BucketStats, Selection, ShapeKey
from chain.run.buckets import remembered as bucket_memory
from chain.run.graphs import GraphsStage, base_name, mark, prefer_graphed
from chain.run.guard import _FALLBACK, GuardedGraph
from chain.run.watch import Demoted, Expected, RunChecks, TooSlow, Watch, Writes
from chain.select import recompiles
from chain.select.attempt import Reference, dynamo_signal, one_line, try_backend
from chain.select.concrete import concretize
from chain.select.isolation import RUN_TIME_PARTS, Isolation, fresh_copy
from chain.select.options import MODES as MODES  # re-exported: chain.select.core.MODES
from chain.select.options import check_backend_options, checked
from chain.select.resolve import BackendSpec, resolve

log = logging.getLogger("chain")


class AllCandidatesFailed(RuntimeError):
    """Every backend of the chain failed on a graph; the message names each and its reason."""

    def __init__(self, record: GraphRecord) -> None:
        lines = "\n".join(f"  - {a}" for a in record.attempts)
        super().__init__(f"every backend failed on graph {record.id} ({record.origin}):\n{lines}")
        self.record = record


class Chain:
    """A dynamo backend that tries `backends` per graph and records every attempt in `report`."""

    @checked  # chain.options: every keyword option is checked (and normalized) first
    def __init__(
        self,
        *backends: BackendSpec,
        mode: str = "first",
        verify: bool = True,
        measure: bool = True,
        strict: bool = False,
        options: dict[str, dict[str, Any]] | None = None,
        report_path: str | os.PathLike[str] | None = None,
        min_speedup: float | None = None,
        compile_timeout_s: float | None = None,
        max_retries: int = 2,
        measure_budget_s: float = 0.2,
        tolerances: dict[torch.dtype, tuple[float, float]] | None = None,
        eager_floor: bool = True,
        cuda_graphs: str | bool = "auto",
        watch: bool = True,
        reverify_rate: float = 0.005,
        memory: bool | None = None,
        store: str | os.PathLike[str] | None = None,
        bucket_after: int | None = None,
        max_buckets: int = 8,
        max_bucket_mb: float | None = None,
        max_artefact_mb: float | None = None,
    ) -> None:
        if not backends:
            raise InvalidBackend(
                "chain() needs at least one backend, e.g. chain('inductor', 'eager')"
            )
        if mode == "fastest" and not measure:
            raise ValueError("mode='fastest' needs measure=True: the winner is chosen by latency")
        self.backends: tuple[Backend, ...] = tuple(resolve(b) for b in backends)
        names = [b.name for b in self.backends]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise InvalidBackend(f"backend(s) named more than once: {', '.join(dupes)}")
        self.options = check_backend_options(self.backends, options)
        if min_speedup is not None and not measure:
            raise ValueError("min_speedup needs measure=True")
        self.mode = mode
        self.verify = verify
        self.measure = measure
        self.strict = strict
        self.min_speedup = min_speedup
        self.compile_timeout_s = compile_timeout_s
        self.max_retries = max_retries
        self.measure_budget_s = measure_budget_s
        self.tolerances = tolerances
        self.eager_floor = eager_floor
        self.graphs = GraphsStage(cuda_graphs, self.backends)
        self.watch = watch
        self.reverify_rate = reverify_rate
        self.bucket_after = bucket_after
        self.max_buckets = max_buckets
        self.max_bucket_mb = max_bucket_mb
        path = report_path if report_path is not None else os.environ.get("CHAIN_REPORT")
        self.report_path = os.fspath(path) if path else None
        self.report_file = ReportFile(self.report_path) if self.report_path else None
        self.report = Report()
        self.name = f"chain({', '.join(names)})"
        decides = dict(backends=names, mode=mode, verify=verify, measure=measure,
                       min_speedup=min_speedup, eager_floor=eager_floor, cuda_graphs=cuda_graphs,
                       options=self.options, tolerances=tolerances,
                       compile_timeout_s=compile_timeout_s)  # fmt: skip
        on = enabled_by_env() if memory is None else memory  # chain.memory: remembered winners
        self.memory = Memory(store, decides, max_artefact_mb) if on else None
        self._recalls: dict[int, Recall] = {}  # per graph id: its key, to forget a demoted winner

    @property
    def speed(self) -> SpeedRules:
        """The speed rules under this chain's options (chain.judge.speed)."""
        return SpeedRules(
            self.eager_floor,
            self.min_speedup,
            self.measure,
            self.strict,
            self.measure_budget_s,
            self.compile_timeout_s,
        )

    def __repr__(self) -> str:
        names = ", ".join(repr(b.name) for b in self.backends)
        return f"chain({names}, mode={self.mode!r})"

    # -- dynamo entry -------------------------------------------------------------------

    def __call__(
        self, gm: fx.GraphModule, example_inputs: Sequence[Any], **dynamo_kwargs: Any
    ) -> Callable[..., Any]:
        """Dynamo's backend call; `options=`/`mode=` that dynamo may pass are accepted."""
        if dynamo_kwargs:
            log.debug("chain ignores dynamo's arguments %s", sorted(dynamo_kwargs))
        inputs = list(example_inputs)
        recall = self.memory.recall(gm, inputs) if self.memory else None
        reference, notes = self._reference(gm, inputs, recall.recorded if recall else None)
        if note := self.graphs.note(self.graphs.why_not(gm, inputs)):
            notes.append(note)
        notes += recall.notes if recall else ()
        compiled = recompiles.current()
        record = GraphRecord(
            id=len(self.report.graphs),
            fingerprint=graphinfo.fingerprint(gm, inputs),
            origin=graphinfo.origin(gm),
            num_nodes=len(gm.graph.nodes),
            ops=graphinfo.op_histogram(gm),
            inputs=graphinfo.input_specs(inputs),
            attempts=(),
            winner=None,
            notes=tuple(notes),
            compile_id=compiled.compile_id,
            recompiles=self._earlier(compiled),
            recompile_reason=compiled.reason,
            code=capture.graph_code(gm),  # for `python -m chain repro` (chain.report.look)
            sources=capture.sources(self.backends),
        )
        self.report.graphs.append(record)
        try:
            hit, fn = None, None
            if recall is not None:  # chain.memory: a remembered winner is compiled alone
                hit, fn, record = self._recalled(gm, inputs, reference, recall, record)
            if hit is not None:
                attempts, eager = list(hit), None
                fns = {a.backend: fn for a in hit if a.status is Status.WON and fn}
            else:
                reference, note = reference.resolved()  # a selection: float64 runs now
                if note:
                    record = dataclasses.replace(record, notes=(*record.notes, note))
                attempts, fns, eager = self._run_candidates(gm, inputs, reference, start=0)
        except Exception as exc:
            if dynamo_signal(exc):  # dynamo restarts this compile: the graph never ran
                self.report.graphs.pop()
            raise
        record = self._finish(record, tuple(attempts), eager)
        stored = self.memory and recall and hit is None  # a selection ran: remember it
        if stored and (why := self._tie_not_kept(record)):
            stored = False
            record = dataclasses.replace(record, notes=(*record.notes, why))
            self.report.graphs[record.id] = record
        fp64 = reference.fp64
        errors = None if fp64 is None else relative_errors(fp64, reference.outputs)
        if stored and (note := self.memory.remember(recall, record, errors)):  # type: ignore[union-attr]
            record = dataclasses.replace(record, notes=(*record.notes, note))
            self.report.graphs[record.id] = record
        if recall is not None and (note := self._keep_artefact(recall, record, fns, gm, inputs)):
            record = dataclasses.replace(record, notes=(*record.notes, note))
            self.report.graphs[record.id] = record
        winner = record.winner
        if winner is None:
            raise AllCandidatesFailed(record)
        log.info("graph %d: %s", record.id, record.winning_attempt)
        watch_for = self._watch_for(record, gm, reference, errors or reference.recorded)
        kept = recall if self.memory is not None and recall is not None else None
        if kept is not None:  # a winner demoted at run time forgets its stored decision
            self._recalls[record.id] = kept
        buckets = self._buckets(record.id, gm, inputs, winner, kept, hit is not None)
        index = self._index(winner)
        return GuardedGraph(self, record.id, gm, fns[winner], index, watch_for, buckets)

    def _tie_not_kept(self, record: GraphRecord) -> str | None:
        """Why a decision is not remembered: under the eager floor, a winner whose measured
        speedup is below 1 won a tie within the noise of this run, or the decision compared
        speeds in a noisy or undecided timing (chain.judge.speed.not_decided); a hit skips
        timing, so remembering it would keep a slower backend in every later process."""
        won = record.winning_attempt
        speedup = won.speedup if won is not None else None
        if self.eager_floor and (why := not_decided(record)):
            return f"memory: not remembered: {why}; the next process selects again"
        if not self.eager_floor or speedup is None or speedup >= 1.0:
            return None
        return (
            f"memory: not remembered: {record.winner} won at {speedup:.2f}x eager, within "
            "the noise of this run; the next process selects again"
        )

    # -- per-shape buckets (chain.run.buckets) ----------------------------------------------

    def _buckets(
        self,
        graph_id: int,
        gm: fx.GraphModule,
        inputs: list[Any],
        winner: str,
        recall: Recall | None = None,
        hit: bool = False,
    ) -> Buckets | None:
        """Buckets for a graph with symbolic sizes that the chain can verify and time, and
        that has fixed-shape candidates; None otherwise (the guard then costs nothing more).
        Graphs that write their inputs or draw random numbers get none. With the decision
        store on (`recall`), bucket decisions are kept with the graph's decision, and on a
        hit (`hit`) the remembered ones are built on first sight of their shape."""
        key = ShapeKey(gm, inputs)
        if self.bucket_after is None or not (self.verify and self.measure) or not key:
            return None
        if graphinfo.mutates_inputs(gm) or graphinfo.random_nodes(gm):
            return None
        candidates = self._bucket_candidates(winner)
        if not candidates:
            return None
        names = [b.name for b in candidates]
        stats = BucketStats(self.bucket_after, self.max_buckets, names, [], self.max_bucket_mb)
        record = self.report.graphs[graph_id]
        remembered, notes = {}, []
        if hit and recall is not None and recall.decision is not None:
            remembered, notes = bucket_memory.load(
                recall.decision.extra.get("buckets"), key, winner
            )
        if remembered:
            notes.append(f"memory: {len(remembered)} remembered bucket(s), built on first sight")
        record = dataclasses.replace(record, buckets=stats, notes=(*record.notes, *notes))
        self.report.graphs[graph_id] = record
        selection = Selection(
            reference=self._reference,
            attempt=lambda b, g, x, r: self._try(b, b, g, x, r),
            candidates=self._bucket_candidates,
            speed=self.speed,
            strict=self.strict,
            saved=self._save,
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
        return [b for b in self.backends if not b.dynamic or (b.name == base and base != EAGER)]

    def _save(self) -> None:
        """Rewrite the report file, if there is one (one writer at a time)."""
        if self.report_file is not None:
            with _FALLBACK:
                self.report_file.write(self.report)

    def _watch_for(
        self,
        record: GraphRecord,
        gm: fx.GraphModule,
        reference: Reference,
        recorded: Sequence[float | None] | None,
    ) -> Callable[[str], Watch | None]:
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
        self.report.graphs[record.id] = dataclasses.replace(record, watch=stats)

        weights = None  # fingerprints of the weights as selection leaves them, no copies
        if self.watch and reference.isolation is not None and reference.runs is not None:
            # fingerprints in RUN_TIME_PARTS, one per re-verification: a sum over every
            # weight each time cost a tiny BERT's call four times over (its vocabulary)
            weights = reference.isolation.watch(
                reference.runs, snapshots=False, parts=RUN_TIME_PARTS
            )

        # activations: their versions are read every call; the weights' (parameters and
        # buffers) with their fingerprints at each re-verification
        isolation = reference.isolation if weights is not None else None
        weights_at = set(isolation.watched) if isolation is not None else set()
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
                tolerances=self.tolerances,
                fp64=reference.fp64 is not None or reference.later is not None,
                # WeightsDamaged names the backend: "<winner>, the winner (at run time, call n)"
                weights=(lambda who: weights.check(f"{winner}, {who}"))
                if weights is not None
                else None,
                versioned=activations,
                recorded=recorded,
                reductions=reference.reductions,
            )

        return watch_for

    def _recalled(
        self,
        gm: fx.GraphModule,
        inputs: list[Any],
        reference: Reference,
        recall: Recall,
        record: GraphRecord,
    ) -> tuple[tuple[Attempt, ...] | None, Callable[..., Any] | None, GraphRecord]:
        """On a remembered decision: compile and verify its winner only (chain.memory).
        Attempts None: no decision, or its winner failed now (noted; selection runs)."""
        if (decision := recall.decision) is None:
            return None, None, record
        names = [b.name for b in self.backends]
        if decision.winner == EAGER and EAGER not in names:  # the eager floor: no compile
            fresh, fn = decision.winning_attempt, gm.forward
        elif base_name(decision.winner) in names:
            backend = self.backends[names.index(base_name(decision.winner))]
            variant = backend if decision.winner == backend.name else self.graphs.variant(backend)
            fresh, fn, note = self._from_artefact(backend, gm, inputs, reference, recall)
            if note:
                record = dataclasses.replace(record, notes=(*record.notes, note))
            if fn is None:
                fresh, fn = self._try(variant or backend, backend, gm, inputs, reference)
        else:
            fresh, fn = Attempt(decision.winner, Status.UNAVAILABLE, "not in this chain"), None
        attempts = replay(recall, fresh) if fresh is not None and fn is not None else None
        if attempts is None:
            failed = fresh or Attempt(decision.winner, Status.COMPILE_ERROR, "no attempt")
            note = miss_note(recall, failed)
            return None, None, dataclasses.replace(record, notes=(*record.notes, note))
        record = dataclasses.replace(
            record,
            notes=(*record.notes, hit_note(recall)),
            eager_ms=decision.eager_ms,
            eager_spread_ms=decision.eager_spread_ms,
        )
        return attempts, fn, record

    def _from_artefact(
        self,
        backend: Backend,
        gm: fx.GraphModule,
        inputs: list[Any],
        reference: Reference,
        recall: Recall,
    ) -> tuple[Attempt | None, Callable[..., Any] | None, str | None]:
        """The remembered winner compiled from its stored artefact (chain.memory.artefacts):
        its attempt and callable, or (None, None, why not) for a compile as usual."""
        decision = recall.decision
        if self.memory is None or decision is None or decision.winner != backend.name:
            return None, None, None
        if backend.reuse is None:
            return None, None, None
        data, note = self.memory.artefact(recall, backend.name, gm, inputs)
        if data is None:
            return None, None, note
        fresh, fn = self._try(backend.reusing(data), backend, gm, inputs, reference)
        if fn is None:
            return (
                None,
                None,
                (
                    f"memory: {backend.name} from its stored artefact failed ({fresh.status}: "
                    f"{fresh.reason}); compiled as usual"
                ),
            )
        loaded = {"key": recall.key, "bytes": len(data)}
        fresh = dataclasses.replace(fresh, details={**fresh.details, "artefact": loaded})
        note = (
            f"memory: {backend.name} built from its stored artefact ({len(data) / 2**20:.1f} "
            "MiB): its expensive step (ONNX export, ...) skipped"
        )
        return fresh, fn, note

    def _keep_artefact(
        self,
        recall: Recall,
        record: GraphRecord,
        fns: dict[str, Callable[..., Any]],
        gm: fx.GraphModule,
        inputs: list[Any],
    ) -> str | None:
        """Store the winner's artefact with its decision, unless it was loaded from one."""
        winner = record.winning_attempt
        names = [b.name for b in self.backends]
        if self.memory is None or winner is None or winner.backend not in names:
            return None
        if "artefact" in winner.details or self.backends[names.index(winner.backend)].reuse is None:
            return None
        return self.memory.keep_artefact(
            recall, winner.backend, fns.get(winner.backend), gm, inputs
        )

    def _earlier(self, compiled: recompiles.CompileOrigin) -> int | None:
        """The graph a recompile replaces: the latest one compiled from the same frame."""
        if not compiled.recompile:
            return None
        same = [
            g.id
            for g in self.report.graphs
            if g.compile_id is not None and g.compile_id.split("/")[0] == str(compiled.frame)
        ]
        return same[-1] if same else None

    def _index(self, name: str) -> int:
        """Position in the chain of the backend an attempt belongs to (variants too); the
        eager floor sits after the last one."""
        names = [b.name for b in self.backends]
        base = base_name(name)
        return names.index(base) if base in names else len(names)

    def backend_name(self, index: int) -> str:
        """The name of the backend at `index` (past the end: the eager floor)."""
        return self.backends[index].name if index < len(self.backends) else EAGER

    def fall_back(self, guard: GuardedGraph, exc: Exception, args: tuple[Any, ...]) -> None:
        """The winner raised at run time: record it and switch to the next backend that passes."""
        record = self.report.graphs[guard.graph_id]
        failed_name = record.winner or self.backend_name(guard.backend_index)
        if self.strict:
            raise exc
        demoted = isinstance(exc, Demoted)  # caught wrong by the run-time checks
        log.warning(
            "graph %d: %s %s (%s); falling back",
            guard.graph_id,
            failed_name,
            "gave a wrong answer at run time" if demoted else "raised at run time",
            str(exc) if demoted else one_line(exc),
        )
        # one copy of the activations for the whole re-selection: other threads' calls may
        # be changing the caller's tensors meanwhile (a faulty winner still in flight)
        inputs = list(args)
        for i in Isolation.of(guard.gm, inputs).copied:
            inputs[i] = fresh_copy(inputs[i])
        reference, _ = self._reference(guard.gm, inputs)
        new, fns, eager = self._run_candidates(
            guard.gm, inputs, reference, start=guard.backend_index + 1
        )
        by_name = {a.backend: a for a in new}
        attempts = tuple(
            dataclasses.replace(
                a,
                status=Status.SLOWER if isinstance(exc, TooSlow) else Status.MISMATCH,
                reason=str(exc),
                error_type=type(exc).__name__ if isinstance(exc, TooSlow) else "Mismatch",
                traceback=None,
            )
            if a.backend == failed_name and demoted
            else dataclasses.replace(
                a,
                status=Status.RUNTIME_ERROR,
                reason=f"at run time: {one_line(exc)}",
                error_type=type(exc).__name__,
                traceback="".join(traceback.format_exception(exc)),
            )
            if a.backend == failed_name
            else by_name.get(a.backend, a)
            for a in record.attempts
        )
        known = {a.backend for a in record.attempts}  # variants tried only now come after
        attempts += tuple(a for a in new if a.backend not in known)
        record = self._finish(record, attempts, eager)
        recall = self._recalls.get(guard.graph_id)
        if demoted and recall is not None and self.memory is not None:
            note = self.memory.forget(recall, f"{failed_name} demoted at run time")
            record = dataclasses.replace(record, notes=(*record.notes, note))
            self.report.graphs[record.id] = record
        if record.winner is None:
            raise AllCandidatesFailed(record) from exc
        guard.switch(fns[record.winner], self._index(record.winner), record.winner)

    def _reference(
        self,
        gm: fx.GraphModule,
        inputs: list[Any],
        recorded: tuple[float | None, ...] | None = None,
    ) -> tuple[Reference, list[str]]:
        """Eager's outputs and the float64 ones to verify against, and notes on what limits
        verification. The chain runs the graph on concrete values (`chain.select.concrete`), every
        run on its own copies of all but the weights, which are watched (`chain.select.isolation`).
        With `recorded` (a remembered decision's eager errors), float64 runs only if the
        winner's quick check against eager needs it (`Reference.verdict`).

        Nothing is copied back to `inputs`: the callable the chain returns is called by
        dynamo (or by the guard, after a fallback) on the caller's real inputs, and that
        one call applies the graph's writes once, as eager would.
        """
        concrete = concretize(inputs)
        random = graphinfo.random_nodes(gm)
        unverified = None
        if concrete.why_not is not None:
            unverified = f"not verified or timed: {concrete.why_not}"
        elif not self.verify:
            unverified = "not verified: verify=False"
        elif random:
            unverified = f"not verified: random ops ({'; '.join(map(str, random))})"
        isolation = Isolation.of(gm, inputs)
        reference = Reference(
            outputs=None,
            unverified=unverified,
            tolerances=self.tolerances,
            runs=concrete.values,
            isolation=isolation,
            reductions=reduction_lengths(gm),
        )
        notes = [unverified] if unverified else []
        if concrete.symbolic and concrete.values is not None:
            notes.append(
                f"dynamic: {concrete.symbolic} symbolic size(s); run at this call's values"
            )
        if graphinfo.mutates_inputs(gm):
            notes.append("mutates its inputs: eager and candidates ran on copies")
        if concrete.values is None:
            return reference, notes
        watch = isolation.watch(concrete.values)
        if not unverified:
            ran = reference.inputs()
            base = {i: version(t) for i, t in enumerate(ran) if isinstance(t, torch.Tensor)}
            with torch.no_grad():
                outputs = gm(*ran)
            if (weights := watch.check("eager (the reference run)")) is not None:
                notes.append(
                    f"eager's reference run {weights}: the chain could not see "
                    "that this graph writes it"
                )
            fp64, later = None, None
            if recorded is not None:  # a remembered winner: float64 only if it needs it
                later = Later(gm, reference.inputs())
            else:
                fp64, note = fp64_reference(gm, reference.inputs())
                notes += [note] if note else []
            after = {i: ran[i] for i in reference.copied() if isinstance(ran[i], torch.Tensor)}
            wrote = frozenset(i for i, x in after.items() if not unchanged(x, concrete.values[i]))
            reference = dataclasses.replace(
                reference,
                outputs=outputs,
                fp64=fp64,
                after=after,
                after_base={i: base[i] for i in after},
                wrote=wrote,
                recorded=recorded,
                later=later,
            )
        return dataclasses.replace(reference, watch=watch), notes

    # -- candidates ---------------------------------------------------------------------

    def _run_candidates(
        self, gm: fx.GraphModule, inputs: list[Any], reference: Reference, start: int
    ) -> tuple[list[Attempt], dict[str, Callable[..., Any]], Timing | None]:
        """Attempts for backends[start:], the passing callables, and eager's timing."""
        attempts: list[Attempt] = []
        passed: dict[str, Callable[..., Any]] = {}
        slow: dict[str, Callable[..., Any]] = {}  # below min_speedup: for the rescue
        floored: dict[str, Callable[..., Any]] = {}  # measurably slower than eager
        eager: Timing | None = None
        shape = graphinfo.graph_hash(gm)
        why_not_graphs = self.graphs.why_not(gm, inputs)
        for backend in self.backends[start:]:
            if passed and self.mode == "first":
                attempts.append(Attempt(backend.name, Status.NOT_TRIED, "a backend earlier won"))
                continue
            attempt, fn = self._try(backend, backend, gm, inputs, reference)
            now = graphinfo.graph_hash(gm)
            if now != shape:  # the contract: the gm is read-only
                shape = now
                attempt = dataclasses.replace(
                    attempt,
                    status=Status.COMPILE_ERROR,
                    error_type="ContractViolation",
                    reason="mutated the graph module it was given (backends must not); "
                    "later backends see the changed graph",
                )
                fn = None
            if fn is not None and self._timed(reference) and self.mode == "first":
                # timed at once: a candidate that fails while timed leaves room for the next
                [attempt], timings = self.speed.time([attempt], {backend.name: fn}, gm, reference)
                eager = timings[EAGER_REF]
                attempt, fn = self.speed.judge(
                    attempt, fn, self._last(backend), timings, slow, floored
                )
            if fn is not None:
                passed[backend.name] = fn
            attempts.append(mark(attempt))
            verified = fn is not None or backend.name in slow or backend.name in floored
            if verified and not attempts[-1].cuda_graphs:
                lost = (slow, floored)
                timed = self._try_graphed(
                    backend, gm, inputs, reference, why_not_graphs, attempts, passed, lost
                )
                eager = timed or eager
        if self._timed(reference) and passed and self.mode == "fastest":
            attempts, timings = self.speed.time(attempts, passed, gm, reference)
            eager = timings.get(EAGER_REF)
        if self.mode == "fastest":
            attempts = self.speed.pick_fastest(attempts, eager)
        elif not passed:
            attempts = self.speed.rescue_slower(attempts, slow, passed)
        attempts = self.speed.explained(attempts)  # the winner's reason: its speed case
        if self.speed.floor_needed(attempts):
            attempts.append(self.speed.floor_attempt(eager))
            passed[EAGER] = gm.forward
        return attempts, passed, eager

    def _try(
        self,
        compiler: Backend,
        backend: Backend,
        gm: fx.GraphModule,
        inputs: list[Any],
        reference: Reference,
    ) -> tuple[Attempt, Callable[..., Any] | None]:
        """One attempt of `compiler` (a backend, or its CUDA graphs variant) with the
        options the user gave `backend` and the chain's retries, timeout and strictness."""
        with progress.working(
            f"compiling and verifying {compiler.name} ({len(gm.graph.nodes)} nodes)"
        ):
            return try_backend(
                compiler,
                gm,
                inputs,
                reference,
                options=self.options.get(backend.name, {}),
                max_retries=self.max_retries,
                # eager is the floor: abandoning its run leaves nothing to fall back on, and
                # the reference already ran the same graph to its end on this thread
                timeout_s=None if compiler.name == EAGER else self.compile_timeout_s,
                strict=self.strict,
            )

    def _try_graphed(
        self,
        backend: Backend,
        gm: fx.GraphModule,
        inputs: list[Any],
        reference: Reference,
        why_not: tuple[Status, str] | None,
        attempts: list[Attempt],
        passed: dict[str, Callable[..., Any]],
        lost: tuple[dict[str, Callable[..., Any]], dict[str, Callable[..., Any]]],
    ) -> Timing | None:
        """The `cuda_graphs` stage for one verified candidate (see chain.graphs).

        Appends the variant's attempt; returns eager's timing when it timed eager anew.
        `lost` holds the candidates that lost on speed: (below min_speedup, below eager).
        """
        variant = self.graphs.variant(backend)
        if variant is None:
            return None
        if why_not is not None:
            if (refusal := self.graphs.refusal(variant, why_not)) is not None:
                attempts.append(refusal)
            return None
        attempt, fn = self.graphs.tried(*self._try(variant, backend, gm, inputs, reference))
        if fn is None or self.mode == "fastest":
            attempts.append(attempt)
            if fn is not None:
                passed[variant.name] = fn
            return None
        plain, eager = attempts.pop(), None
        if backend.name not in passed:  # plain lost on speed: the variant is timed on its own
            if self._timed(reference):
                [attempt], timings = self.speed.time([attempt], {variant.name: fn}, gm, reference)
                eager = timings[EAGER_REF]
                attempt, fn = self.speed.judge(attempt, fn, self._last(backend), timings, *lost)
            if fn is not None:
                passed[variant.name] = fn
            attempts += [plain, attempt]
            return eager
        if self._timed(reference):
            fns = {backend.name: passed[backend.name], variant.name: fn}
            pair, timings = self.speed.time([plain, attempt], fns, gm, reference)
            eager = timings[EAGER_REF]
            plain, attempt = pair
            if attempt.status is Status.WON and (
                reason := self.speed.below_floor(attempt.backend, timings)
            ):
                attempt = dataclasses.replace(attempt, status=Status.SLOWER, reason=reason)
        plain, attempt = prefer_graphed(plain, attempt)
        for a, f in ((plain, passed.get(backend.name)), (attempt, fn)):
            passed.pop(a.backend, None)
            if a.status is Status.WON and f is not None:
                passed[a.backend] = f
        attempts += [plain, attempt]
        return eager

    def _last(self, backend: Backend) -> bool:
        """The chain's last backend: exempt from min_speedup (it is the last resort)."""
        return backend is self.backends[-1]

    def _timed(self, reference: Reference) -> bool:
        """Whether candidates are timed: measure=True and the graph can be run here."""
        return self.measure and reference.runnable

    def _finish(
        self, record: GraphRecord, attempts: tuple[Attempt, ...], eager: Timing | None
    ) -> GraphRecord:
        """Store the graph's attempts and winner; rewrite the report file if there is one."""
        winner = next((a.backend for a in attempts if a.status is Status.WON), None)
        record = dataclasses.replace(
            record,
            attempts=tuple(mark(a) for a in attempts),
            winner=winner,
            eager_ms=eager.median_ms if eager is not None else record.eager_ms,
            eager_spread_ms=eager.spread_ms if eager is not None else record.eager_spread_ms,
        )
        self.report.graphs[record.id] = record
        trace.emit(record)  # TORCH_TRACE: the decision beside dynamo's entries (chain.report.look)
        if self.report_file is not None:  # a failed write is a warning (chain.report.report_file)
            self.report_file.write(self.report)
        return record
