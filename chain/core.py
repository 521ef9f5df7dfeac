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
from chain import graphinfo, recompiles
from chain.attempt import Reference, dynamo_signal, one_line, try_backend
from chain.concrete import concretize
from chain.fp64 import fp64_reference
from chain.graphs import GraphsStage, base_name, mark, prefer_graphed
from chain.guard import GuardedGraph
from chain.options import MODES as MODES  # re-exported: chain.core.MODES
from chain.options import check_backend_options, checked
from chain.records import Attempt, GraphRecord, Status
from chain.report import Report
from chain.resolve import BackendSpec, resolve
from chain.speed import EAGER, EAGER_REF, SpeedRules
from chain.timing import Timing

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
        path = report_path if report_path is not None else os.environ.get("CHAIN_REPORT")
        self.report_path = os.fspath(path) if path else None
        self.report = Report()
        self.name = f"chain({', '.join(names)})"

    @property
    def speed(self) -> SpeedRules:
        """The speed rules under this chain's options (chain.speed)."""
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
        reference, notes = self._reference(gm, inputs)
        if note := self.graphs.note(self.graphs.why_not(gm, inputs)):
            notes.append(note)
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
        )
        self.report.graphs.append(record)
        try:
            attempts, fns, eager = self._run_candidates(gm, inputs, reference, start=0)
        except Exception as exc:
            if dynamo_signal(exc):  # dynamo restarts this compile: the graph never ran
                self.report.graphs.pop()
            raise
        record = self._finish(record, tuple(attempts), eager)
        winner = record.winner
        if winner is None:
            raise AllCandidatesFailed(record)
        log.info("graph %d: %s", record.id, record.winning_attempt)
        return GuardedGraph(self, record.id, gm, fns[winner], self._index(winner))

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
        log.warning(
            "graph %d: %s raised at run time (%s); falling back",
            guard.graph_id,
            failed_name,
            one_line(exc),
        )
        inputs = list(args)
        reference, _ = self._reference(guard.gm, inputs)
        new, fns, eager = self._run_candidates(
            guard.gm, inputs, reference, start=guard.backend_index + 1
        )
        by_name = {a.backend: a for a in new}
        attempts = tuple(
            dataclasses.replace(
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
        if record.winner is None:
            raise AllCandidatesFailed(record) from exc
        guard.switch(fns[record.winner], self._index(record.winner), record.winner)

    def _reference(self, gm: fx.GraphModule, inputs: list[Any]) -> tuple[Reference, list[str]]:
        """Eager's outputs and the float64 ones to verify against, and notes on what limits
        verification. The chain runs the graph on concrete values (`chain.concrete`)."""
        concrete = concretize(inputs)
        random = graphinfo.random_nodes(gm)
        unverified = None
        if concrete.why_not is not None:
            unverified = f"not verified or timed: {concrete.why_not}"
        elif not self.verify:
            unverified = "not verified: verify=False"
        elif random:
            unverified = f"not verified: random ops ({'; '.join(map(str, random))})"
        reference = Reference(
            outputs=None,
            clone_inputs=graphinfo.mutates_inputs(gm),
            unverified=unverified,
            tolerances=self.tolerances,
            runs=concrete.values,
        )
        notes = [unverified] if unverified else []
        if concrete.symbolic and concrete.values is not None:
            notes.append(
                f"dynamic: {concrete.symbolic} symbolic size(s); run at this call's values"
            )
        if reference.clone_inputs:
            notes.append("mutates its inputs: eager and candidates ran on clones")
        if not unverified:
            with torch.no_grad():
                outputs = gm(*(ran := reference.inputs()))
            fp64, note = fp64_reference(gm, reference.inputs())
            notes += [note] if note else []
            after = {i: ran[i] for i in reference.cloned()}
            reference = dataclasses.replace(reference, outputs=outputs, fp64=fp64, after=after)
        return reference, notes

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
        return try_backend(
            compiler,
            gm,
            inputs,
            reference,
            options=self.options.get(backend.name, {}),
            max_retries=self.max_retries,
            timeout_s=self.compile_timeout_s,
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
        if self.report_path:
            self.report.save(self.report_path)
        return record
