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

from backends.errors import InvalidBackend, InvalidOption
from backends.registry import Backend
from chain import graphinfo
from chain.attempt import Reference, failed_attempt, one_line, try_backend
from chain.graphs import GraphsStage, base_name, mark, prefer_graphed
from chain.guard import GuardedGraph
from chain.records import Attempt, GraphRecord, Status
from chain.report import Report
from chain.resolve import BackendSpec, resolve
from chain.timing import TimingError, median_ms

log = logging.getLogger("chain")

MODES = ("first", "fastest")
_EAGER_REF = "<eager reference>"
EAGER_BIAS = 0.99  # a compiler must beat eager by 1% to win in "fastest" mode: noise never does


class AllCandidatesFailed(RuntimeError):
    """Every backend of the chain failed on a graph; the message names each and its reason."""

    def __init__(self, record: GraphRecord) -> None:
        lines = "\n".join(f"  - {a}" for a in record.attempts)
        super().__init__(f"every backend failed on graph {record.id} ({record.origin}):\n{lines}")
        self.record = record


class Chain:
    """A dynamo backend that tries `backends` per graph and records every attempt in `report`."""

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
        cuda_graphs: str | bool = "auto",
    ) -> None:
        if not backends:
            raise InvalidBackend(
                "chain() needs at least one backend, e.g. chain('inductor', 'eager')"
            )
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
        if mode == "fastest" and not measure:
            raise ValueError("mode='fastest' needs measure=True: the winner is chosen by latency")
        self.backends: tuple[Backend, ...] = tuple(resolve(b) for b in backends)
        names = [b.name for b in self.backends]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise InvalidBackend(f"backend(s) named more than once: {', '.join(dupes)}")
        self.options = {k: dict(v) for k, v in (options or {}).items()}
        for key, opts in self.options.items():
            if key not in names:
                raise InvalidOption(
                    f"options for {key!r}, which is not in this chain; "
                    f"valid keys: {', '.join(names)}"
                )
            next(b for b in self.backends if b.name == key).check_options(opts)
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
        self.graphs = GraphsStage(cuda_graphs, self.backends)
        path = report_path if report_path is not None else os.environ.get("CHAIN_REPORT")
        self.report_path = os.fspath(path) if path else None
        self.report = Report()
        self.name = f"chain({', '.join(names)})"

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
        )
        self.report.graphs.append(record)
        attempts, fns, eager_ms = self._run_candidates(gm, inputs, reference, start=0)
        record = self._finish(record, tuple(attempts), eager_ms)
        winner = record.winner
        if winner is None:
            raise AllCandidatesFailed(record)
        log.info("graph %d: %s", record.id, record.winning_attempt)
        return GuardedGraph(self, record.id, gm, fns[winner], self._index(winner))

    def fall_back(self, guard: GuardedGraph, exc: Exception, args: tuple[Any, ...]) -> None:
        """The winner raised at run time: record it and switch to the next backend that passes."""
        record = self.report.graphs[guard.graph_id]
        failed_name = record.winner or self.backends[guard.backend_index].name
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
        new, fns, eager_ms = self._run_candidates(
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
        record = self._finish(record, attempts, eager_ms)
        if record.winner is None:
            raise AllCandidatesFailed(record) from exc
        guard.fn = fns[record.winner]
        guard.backend_index = self._index(record.winner)
        guard.chain_details["winner"] = record.winner

    def _index(self, winner: str) -> int:
        """Position in the chain of the backend an attempt name belongs to (variants too)."""
        return [b.name for b in self.backends].index(base_name(winner))

    def _reference(self, gm: fx.GraphModule, inputs: list[Any]) -> tuple[Reference, list[str]]:
        """Eager's outputs to verify against, and notes on what limits verification."""
        random_ops = sorted(set(graphinfo.random_ops(gm)))
        unverified = None
        if not self.verify:
            unverified = "not verified: verify=False"
        elif random_ops:
            unverified = f"not verified: random ops ({', '.join(random_ops)})"
        reference = Reference(
            outputs=None,
            clone_inputs=graphinfo.mutates_inputs(gm),
            unverified=unverified,
            tolerances=self.tolerances,
        )
        notes = [unverified] if unverified else []
        if reference.clone_inputs:
            notes.append("mutates its inputs: eager and candidates ran on clones")
        if not unverified:
            with torch.no_grad():
                reference = dataclasses.replace(reference, outputs=gm(*reference.inputs(inputs)))
        return reference, notes

    # -- candidates ---------------------------------------------------------------------

    def _run_candidates(
        self, gm: fx.GraphModule, inputs: list[Any], reference: Reference, start: int
    ) -> tuple[list[Attempt], dict[str, Callable[..., Any]], float | None]:
        """Attempts for backends[start:], the passing callables, and eager's latency."""
        attempts: list[Attempt] = []
        passed: dict[str, Callable[..., Any]] = {}
        slow: dict[str, Callable[..., Any]] = {}
        eager_ms: float | None = None
        shape = graphinfo.fingerprint(gm, inputs)
        why_not_graphs = self.graphs.why_not(gm, inputs)
        for backend in self.backends[start:]:
            if passed and self.mode == "first":
                attempts.append(Attempt(backend.name, Status.NOT_TRIED, "a backend earlier won"))
                continue
            attempt, fn = try_backend(
                backend,
                gm,
                inputs,
                reference,
                options=self.options.get(backend.name, {}),
                max_retries=self.max_retries,
                timeout_s=self.compile_timeout_s,
                strict=self.strict,
            )
            now = graphinfo.fingerprint(gm, inputs)
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
            if fn is not None and self.measure and self.mode == "first":
                # timed at once: a candidate that fails while timed leaves room for the next
                [attempt], eager_ms = self._measure(
                    [attempt], {backend.name: fn}, gm, inputs, reference
                )
                if attempt.status is not Status.WON:
                    fn = None
                elif self._too_slow(attempt, backend):
                    speedup = f"{attempt.speedup:.2f}x"
                    attempt = dataclasses.replace(
                        attempt,
                        status=Status.SLOWER,
                        reason=f"{speedup} over eager < min_speedup {self.min_speedup}",
                    )
                    slow[backend.name], fn = fn, None
            if fn is not None:
                passed[backend.name] = fn
            attempts.append(mark(attempt))
            if (fn is not None or backend.name in slow) and not attempts[-1].cuda_graphs:
                eager_ms = self._try_graphed(backend, gm, inputs, reference, why_not_graphs,
                                             attempts, passed, slow) or eager_ms  # fmt: skip
        if self.measure and passed and self.mode == "fastest":
            attempts, eager_ms = self._measure(attempts, passed, gm, inputs, reference)
        if self.mode == "fastest":
            attempts = self._pick_fastest(attempts)
        elif not passed:
            attempts = self._rescue_slower(attempts, slow, passed)
        return attempts, passed, eager_ms

    def _try_graphed(
        self,
        backend: Backend,
        gm: fx.GraphModule,
        inputs: list[Any],
        reference: Reference,
        why_not: tuple[Status, str] | None,
        attempts: list[Attempt],
        passed: dict[str, Callable[..., Any]],
        slow: dict[str, Callable[..., Any]],
    ) -> float | None:
        """The `cuda_graphs` stage for one verified candidate (see chain.graphs).

        Appends the variant's attempt; returns eager's latency when it timed eager anew.
        """
        variant = self.graphs.variant(backend)
        if variant is None:
            return None
        if why_not is not None:
            if (refusal := self.graphs.refusal(variant, why_not)) is not None:
                attempts.append(refusal)
            return None
        attempt, fn = self.graphs.tried(
            *try_backend(
                variant,
                gm,
                inputs,
                reference,
                options=self.options.get(backend.name, {}),
                max_retries=self.max_retries,
                timeout_s=self.compile_timeout_s,
                strict=self.strict,
            )
        )
        if fn is None or self.mode == "fastest":
            attempts.append(attempt)
            if fn is not None:
                passed[variant.name] = fn
            return None
        plain, eager_ms = attempts.pop(), None
        if backend.name in slow:  # plain missed min_speedup: the variant is timed on its own
            if self.measure:
                [attempt], eager_ms = self._measure(
                    [attempt], {variant.name: fn}, gm, inputs, reference
                )
            if attempt.status is Status.WON and self._too_slow(attempt, backend):
                reason = f"{attempt.speedup:.2f}x over eager < min_speedup {self.min_speedup}"
                attempt = dataclasses.replace(attempt, status=Status.SLOWER, reason=reason)
                slow[variant.name] = fn
            elif attempt.status is Status.WON:
                passed[variant.name] = fn
            attempts += [plain, attempt]
            return eager_ms
        if self.measure:
            fns = {backend.name: passed[backend.name], variant.name: fn}
            pair, eager_ms = self._measure([plain, attempt], fns, gm, inputs, reference)
            plain, attempt = pair
        plain, attempt = prefer_graphed(plain, attempt)
        for a, f in ((plain, passed.get(backend.name)), (attempt, fn)):
            passed.pop(a.backend, None)
            if a.status is Status.WON and f is not None:
                passed[a.backend] = f
        attempts += [plain, attempt]
        return eager_ms

    def _measure(
        self,
        attempts: list[Attempt],
        fns: dict[str, Callable[..., Any]],
        gm: fx.GraphModule,
        inputs: list[Any],
        reference: Reference,
    ) -> tuple[list[Attempt], float]:
        """Time eager and `fns` interleaved in one run; fill in latency and speedup.

        A candidate that raises while timed becomes a runtime_error and leaves `fns`.
        """
        while True:
            try:
                timings = median_ms(
                    {_EAGER_REF: gm.forward, **fns},
                    reference.inputs(inputs),
                    budget_s=self.measure_budget_s,
                )
                break
            except TimingError as err:
                if err.name not in fns or self.strict:
                    raise err.exc from None
                del fns[err.name]
                attempts = [
                    failed_attempt(
                        a.backend,
                        Status.RUNTIME_ERROR,
                        err.exc,
                        reason_prefix="while timed: ",
                        compile_s=a.compile_s,
                        details=a.details,
                    )
                    if a.backend == err.name
                    else a
                    for a in attempts
                ]
        eager_ms = timings[_EAGER_REF]
        return [
            dataclasses.replace(
                a, latency_ms=timings[a.backend], speedup=eager_ms / timings[a.backend]
            )
            if a.backend in fns
            else a
            for a in attempts
        ], eager_ms

    def _too_slow(self, attempt: Attempt, backend: Backend) -> bool:
        if self.min_speedup is None or attempt.speedup is None:
            return False
        return attempt.speedup < self.min_speedup and backend is not self.backends[-1]

    def _pick_fastest(self, attempts: list[Attempt]) -> list[Attempt]:
        """Among passing attempts the fastest wins; eager wins unless beaten by 1%."""
        passing = [a for a in attempts if a.status is Status.WON]
        if not passing:
            return attempts
        best = min(passing, key=lambda a: a.latency_ms or float("inf"))
        eager = next((a for a in passing if a.backend == "eager"), None)
        if (
            eager is not None
            and best is not eager
            and ((best.latency_ms or 0) > EAGER_BIAS * (eager.latency_ms or 0))
        ):
            best = eager
        return [
            a
            if a is best or a.status is not Status.WON
            else dataclasses.replace(
                a,
                status=Status.SLOWER,
                reason=f"{a.latency_ms:.3f} ms vs {best.latency_ms:.3f} ms for {best.backend}",
            )
            for a in attempts
        ]

    def _rescue_slower(
        self,
        attempts: list[Attempt],
        slow: dict[str, Callable[..., Any]],
        passed: dict[str, Callable[..., Any]],
    ) -> list[Attempt]:
        """No candidate reached min_speedup: the fastest that passed verification wins anyway."""
        candidates = [a for a in attempts if a.backend in slow]
        if not candidates:
            return attempts
        best = max(candidates, key=lambda a: a.speedup or 0.0)
        passed[best.backend] = slow[best.backend]
        reason = f"no backend reached min_speedup {self.min_speedup}; the fastest that passed"
        return [
            dataclasses.replace(a, status=Status.WON, reason=reason) if a is best else a
            for a in attempts
        ]

    def _finish(
        self, record: GraphRecord, attempts: tuple[Attempt, ...], eager_ms: float | None
    ) -> GraphRecord:
        """Store the graph's attempts and winner; rewrite the report file if there is one."""
        winner = next((a.backend for a in attempts if a.status is Status.WON), None)
        record = dataclasses.replace(
            record,
            attempts=tuple(mark(a) for a in attempts),
            winner=winner,
            eager_ms=eager_ms if eager_ms is not None else record.eager_ms,
        )
        self.report.graphs[record.id] = record
        if self.report_path:
            self.report.save(self.report_path)
        return record
