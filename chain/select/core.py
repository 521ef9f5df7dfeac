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

from backends.errors import InvalidBackend
from backends.registry import Backend
from chain.judge.accuracy import relative_errors
from chain.judge.speed import EAGER, SpeedRules, floor_at_run_time, not_decided
from chain.judge.timing import Timing
from chain.memory import Memory, Recall, enabled_by_env
from chain.report import graphinfo
from chain.report.look import capture, trace
from chain.report.records import Attempt, GraphRecord, Status
from chain.report.report import Report
from chain.report.report_file import ReportFile
from chain.run.graphs import GraphsStage, base_name, mark
from chain.run.guard import _FALLBACK, GuardedGraph
from chain.run.watch import Demoted, TooSlow
from chain.run.watch.updates import UpdatesOften
from chain.select import recompiles, torch_modes
from chain.select.attempt import dynamo_signal, one_line
from chain.select.candidates import Candidates
from chain.select.challenge import challenge, default_challengers
from chain.select.isolation import Isolation, fresh_copy
from chain.select.once import Once, Reused
from chain.select.options import MODES as MODES  # re-exported: chain.select.core.MODES
from chain.select.options import check_backend_options, checked
from chain.select.racing import Racing
from chain.select.recall import Remembered
from chain.select.resolve import BackendSpec, resolve
from chain.select.serving import Serving

log = logging.getLogger("chain")


class AllCandidatesFailed(RuntimeError):
    """Every backend of the chain failed on a graph; the message names each and its reason."""

    def __init__(self, record: GraphRecord) -> None:
        lines = "\n".join(f"  - {a}" for a in record.attempts)
        super().__init__(f"every backend failed on graph {record.id} ({record.origin}):\n{lines}")
        self.record = record


class Chain(Remembered, Serving, Candidates):
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
        challengers: str | Sequence[BackendSpec] = "auto",
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
        self._once = Once(decides)  # one selection per graph in this process (chain.select.once)
        # raced at run time once compiled in the background (chain.select.challenge)
        self.challengers: str | tuple[Backend, ...] = (
            challengers if isinstance(challengers, str) else tuple(resolve(b) for b in challengers)
        )

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
        """Dynamo's backend call; torch.compile's `mode=` must agree with the chain's
        options and its `options=` are refused (chain.select.torch_modes)."""
        if dynamo_kwargs:
            settings = {"mode": self.mode, "cuda_graphs": self.graphs.setting}
            torch_modes.check_call(dynamo_kwargs, settings)
        inputs = list(example_inputs)
        with self._once.turn(gm, inputs) as turn:  # a graph selected again reuses its decision
            recall = turn.recall(
                self.memory.recall(gm, inputs) if self.memory else None, self.report
            )
            guard = self._compile_graph(gm, inputs, recall)
            turn.decided(guard.graph_id, self.report)
            return guard

    def _compile_graph(
        self, gm: fx.GraphModule, inputs: list[Any], recall: Recall | None
    ) -> GuardedGraph:
        """Select a winner for `gm` (or compile the one `recall` remembers) and guard it."""
        reference, notes = self._reference(gm, inputs, recall.recorded if recall else None)
        if note := self.graphs.note(self.graphs.why_not(gm, inputs)):
            notes.append(note)
        notes += recall.notes if recall else ()
        compiled = recompiles.current()
        if note := recompiles.limit_note(compiled):
            notes.append(note)
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
        note = self.memory.remember(recall, record, errors) if stored else None  # type: ignore[union-attr]
        if note:
            record = dataclasses.replace(record, notes=(*record.notes, note))
            self.report.graphs[record.id] = record
        decided = hit is not None or (bool(stored) and note is None)  # a decision is kept
        if (
            recall is not None
            and not isinstance(recall, Reused)  # its selection kept what there was to keep
            and (note := self._keep_artefact(recall, record, fns, gm, inputs, reference, decided))
        ):
            record = dataclasses.replace(record, notes=(*record.notes, note))
            self.report.graphs[record.id] = record
        winner = record.winner
        if winner is None:
            raise AllCandidatesFailed(record)
        log.info("graph %d: %s", record.id, record.winning_attempt)
        watch_for, updates = self._watch_for(record, gm, reference, errors or reference.recorded)
        kept = recall if self.memory is not None and recall is not None else None
        if kept is not None:  # a winner demoted at run time forgets its stored decision
            self._recalls[record.id] = kept
        buckets = self._buckets(record.id, gm, inputs, winner, kept, hit is not None)
        index = self._index(winner)
        guard = GuardedGraph(self, record.id, gm, fns[winner], index, watch_for, buckets, updates)
        racing = Racing(self, record.id, gm, reference)  # selection goes on while it serves
        racing.start(guard, fns)
        if hit is None and (note := self._challenge(record, gm, inputs, reference, guard, racing)):
            self._note(record.id, note)
        return guard

    def _challenge(
        self,
        record: GraphRecord,
        gm: fx.GraphModule,
        inputs: list[Any],
        reference: Any,
        guard: GuardedGraph,
        racing: Racing,
    ) -> str | None:
        """Compile the candidates after the winner that were not tried, and the chain's
        challengers, in the background; they join the graph's race (chain.select.challenge)."""
        names = [b.name for b in self.backends]
        tried = {a.backend for a in record.attempts if a.status is not Status.NOT_TRIED}
        later = [b for b in self.backends if b.name not in tried]
        if not_decided(self.report.graphs[record.id]) is None:  # eager lost, with confidence
            later = [b for b in later if b.name != EAGER]
        named = default_challengers(names) if self.challengers == "auto" else self.challengers
        later += [b for b in named if b.name not in tried and b not in later]
        if self.challengers == "auto" and self.graphs.why_not(gm, inputs) is None:
            graphed = [v for b in later if (v := self.graphs.variant(b)) is not None]
            later += [v for v in graphed if v.name not in tried]  # on CUDA: inductor+graphs
        if racing.why_not and later:
            return f"challengers not compiled: {racing.why_not}"
        return challenge(self, record.id, gm, inputs, reference, guard, later, racing.join)

    def _note(self, graph_id: int, note: str) -> None:
        """Add `note` to graph `graph_id`'s record."""
        record = self.report.graphs[graph_id]
        self.report.graphs[graph_id] = dataclasses.replace(record, notes=(*record.notes, note))

    def _save(self) -> None:
        """Rewrite the report file, if there is one (one writer at a time)."""
        if self.report_file is not None:
            with _FALLBACK:
                self.report_file.write(self.report)

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
        won = any(a.status is Status.WON for a in new)
        if not won and base_name(failed_name) != EAGER:  # eager: always the last resort at
            new.append(floor_at_run_time(eager))  # run time, whatever the chain lists
            fns[EAGER] = guard.gm.forward
        by_name = {a.backend: a for a in new}
        slower = isinstance(exc, (TooSlow, UpdatesOften))
        attempts = tuple(
            dataclasses.replace(
                a,
                status=Status.SLOWER if slower else Status.MISMATCH,
                reason=str(exc),
                error_type=type(exc).__name__ if slower else "Mismatch",
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
        forget = demoted and not isinstance(exc, UpdatesOften)  # updates are this run's
        if forget and recall is not None and self.memory is not None:
            note = self.memory.forget(recall, f"{failed_name} demoted at run time")
            record = dataclasses.replace(record, notes=(*record.notes, note))
            self.report.graphs[record.id] = record
        if record.winner is None:
            raise AllCandidatesFailed(record) from exc
        guard.switch(fns[record.winner], self._index(record.winner), record.winner)

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
