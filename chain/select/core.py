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

from backends.common.fx_utils import keep_graphargs
from backends.errors import InvalidBackend
from backends.registry import Backend
from chain.judge.speed import EAGER, SpeedRules, floor_at_run_time
from chain.memory import Memory, enabled_by_env
from chain.report.records import GraphRecord, Status
from chain.report.report import Report
from chain.report.report_file import ReportFile
from chain.run.callers import CALLERS, may_trace
from chain.run.graphs import GraphsStage, base_name
from chain.run.guard import GuardedGraph
from chain.run.watch import Demoted, TooSlow
from chain.run.watch.updates import UpdatesOften
from chain.select import torch_modes
from chain.select.attempt import dynamo_signal, one_line
from chain.select.candidates import Selection
from chain.select.challenge import AUTO, default_challengers
from chain.select.isolation import Isolation, fresh_copy
from chain.select.once import Once
from chain.select.options import MODES as MODES  # re-exported: chain.select.core.MODES
from chain.select.options import check_backend_options, checked
from chain.select.racing import RaceStage
from chain.select.recall import Remembered
from chain.select.records import Records
from chain.select.resolve import BackendSpec, resolve
from chain.select.serving import ServingPlan

log = logging.getLogger("chain")


class AllCandidatesFailed(RuntimeError):
    """Every backend of the chain failed on a graph; the message names each and its reason."""

    def __init__(self, record: GraphRecord) -> None:
        lines = "\n".join(f"  - {a}" for a in record.attempts)
        super().__init__(f"every backend failed on graph {record.id} ({record.origin}):\n{lines}")
        self.record = record


class Chain:
    """A dynamo backend that tries `backends` per graph and records every attempt in `report`.

    Each new graph goes through its stages in order: the decision store's lookup
    (`recall`), the selection (`selection`), keeping the decision (`recall` again), and the
    serving plan (`serving`: the guard, its watch and buckets); every record change goes
    through `records`."""

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
        regions: bool = False,
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
        self.records = Records(self.report, self.report_file, self.backends)
        self.name = f"chain({', '.join(names)})"
        decides = dict(backends=names, mode=mode, verify=verify, measure=measure,
                       min_speedup=min_speedup, eager_floor=eager_floor, cuda_graphs=cuda_graphs,
                       options=self.options, tolerances=tolerances,
                       compile_timeout_s=compile_timeout_s)  # fmt: skip
        if regions:  # a mixed decision is another decision (absent: keys as before)
            decides["regions"] = True
        on = enabled_by_env() if memory is None else memory  # chain.memory: remembered winners
        self.memory = Memory(store, decides, max_artefact_mb) if on else None
        self._once = Once(decides)  # one selection per graph in this process (chain.select.once)
        # the stages a new graph goes through, in order (see __call__)
        self.selection = Selection(
            self.backends, self.options, self.graphs, self.speed, mode=mode, verify=verify,
            tolerances=tolerances, max_retries=max_retries, regions=regions,
            buckets=bucket_after is not None,
        )  # fmt: skip
        named = challengers if isinstance(challengers, str) else tuple(map(resolve, challengers))
        self.recall = Remembered(
            self.memory, self.selection, self.records, eager_floor,
            tuple(default_challengers(names)) if named == AUTO else named,
        )  # fmt: skip
        self.racing = RaceStage(
            self.records, self.selection, measure, named, compile_timeout_s, self.recall
        )  # selection going on while the graph serves (chain.select.racing)
        self.serving = ServingPlan(
            self.selection, self.records, self.memory, watch=watch, reverify_rate=reverify_rate,
            bucket_after=bucket_after, max_buckets=max_buckets, max_bucket_mb=max_bucket_mb,
        )  # fmt: skip

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
        """Dynamo's call for a new graph: look its decision up, select (or compile the
        remembered winner), remember, then wrap the winner in a guard that watches it.
        torch.compile's `mode=` must agree with the chain's options and its `options=` are
        refused (chain.select.torch_modes)."""
        if dynamo_kwargs:
            settings = {"mode": self.mode, "cuda_graphs": self.graphs.setting}
            torch_modes.check_call(dynamo_kwargs, settings)
        inputs = list(example_inputs)
        keep_graphargs(gm)  # what later compiles read (buckets, re-exports): dynamo drops it
        with self._once.turn(gm, inputs) as turn:  # a graph selected again reuses its decision
            recall = turn.recall(self.recall.lookup(gm, inputs), self.report)  # look up
            recorded, remembered = (recall.recorded, recall.notes) if recall else (None, ())
            reference, notes = self.selection.reference(gm, inputs, recorded)
            graphs = self.graphs.note(self.graphs.why_not(gm, inputs))
            record = self.records.open(gm, inputs, [*notes, graphs, *remembered])
            try:
                selected = self.recall.compile(gm, inputs, reference, recall, record.id)
                if selected is None:  # select: float64 runs now
                    reference, note = reference.resolved()
                    self.records.note(record.id, note)
                    selected = self.selection.select(gm, inputs, reference)
            except Exception as exc:
                if dynamo_signal(exc):  # dynamo restarts this compile: the graph never ran
                    self.records.drop(record.id)
                raise
            record = self.records.finish(record.id, selected.attempts, selected.eager)
            errors = reference.errors()  # eager's against float64, per output
            self.recall.keep(recall, record, selected, gm, inputs, reference, errors)  # remember
            record = self.report.graphs[record.id]
            if record.winner is None:
                raise AllCandidatesFailed(record)
            log.info("graph %d: %s", record.id, record.winning_attempt)
            plan = self.serving  # wrap and watch
            guard = plan.guard(self, record, gm, inputs, reference, selected, recall, errors)
            self.recall.hand_over(record.id, guard)  # a faster package, once built, serves
            self.racing.start(guard, gm, inputs, reference, selected)  # race while serving
            turn.decided(guard.graph_id, self.report)
            return guard

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
        reference, _ = self.selection.reference(guard.gm, inputs)
        start = guard.backend_index + 1
        if not may_trace():  # compiling traces the graph: eager, beside other threads
            start = len(self.selection.backends)
            self.records.note(record.id, f"later backends not compiled at run time: "
                              f"{CALLERS.why_not()}")  # fmt: skip
        new, fns, eager = self.selection.run(guard.gm, inputs, reference, start=start)
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
        record = self.records.finish(record.id, attempts, eager)
        if demoted and not isinstance(exc, UpdatesOften):  # updates are this run's
            why = f"{failed_name} demoted at run time"
            record = self.records.note(record.id, self.recall.forget(record.id, why))
        if record.winner is None:
            raise AllCandidatesFailed(record) from exc
        guard.switch(fns[record.winner], self.selection.index(record.winner), record.winner)
