"""Selection proper: eager's reference run, then each candidate in turn (compiled, run,
verified, timed), with its CUDA-graphs variant where the stage applies."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from backends.registry import Backend
from chain.judge.accuracy import reduction_lengths
from chain.judge.speed import EAGER, EAGER_REF, SpeedRules
from chain.judge.speed import timed as timed_by
from chain.judge.timing import Timing
from chain.report import graphinfo
from chain.report.look import progress
from chain.report.records import Attempt, Status
from chain.run.graphs import GraphsStage, base_name, mark, prefer_graphed
from chain.select.attempt import Reference, try_backend, why_not_raced
from chain.select.concrete import concretize
from chain.select.eager_run import eager_run
from chain.select.isolation import Isolation
from chain.select.regions.mix import mix
from chain.select.timed import time_candidates


@dataclasses.dataclass(frozen=True)
class Selected:
    """What a selection (or a remembered decision) gives a graph: its attempts, the
    callables of those that passed, eager's timing (None: not timed now), and whether a
    remembered decision gave them (`hit`: no selection ran)."""

    attempts: tuple[Attempt, ...]
    fns: dict[str, Callable[..., Any]]
    eager: Timing | None = None
    hit: bool = False
    provisional: str | None = None  # a remembered decision not settled yet: why (it races)


@dataclasses.dataclass
class Selection:
    """The selection stage: eager's reference run, then the chain's backends in order
    (compiled, run, verified, timed), under the chain's options."""

    backends: tuple[Backend, ...]
    options: dict[str, dict[str, Any]]  # per backend, the user's options for it
    graphs: GraphsStage  # the CUDA graphs stage (chain.run.graphs)
    speed: SpeedRules
    mode: str
    verify: bool
    tolerances: dict[torch.dtype, tuple[float, float]] | None
    max_retries: int
    regions: bool = False  # fastest mode: also try the graph's regions under mixed backends
    buckets: bool = False  # shape buckets serve symbolic graphs (no run-time race there)

    def reference(
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

            def written() -> str | None:
                weights = watch.check("eager (the reference run)")
                return weights and (
                    f"eager's reference run {weights}: the chain could not see "
                    "that this graph writes it"
                )

            reference, ran_notes = eager_run(gm, reference, recorded, written)
            notes += ran_notes
        return dataclasses.replace(reference, watch=watch), notes

    # -- candidates ---------------------------------------------------------------------

    def select(self, gm: fx.GraphModule, inputs: list[Any], reference: Reference) -> Selected:
        """A selection over all the chain's backends."""
        attempts, fns, eager = self.run(gm, inputs, reference)
        return Selected(tuple(attempts), fns, eager)

    def run(
        self, gm: fx.GraphModule, inputs: list[Any], reference: Reference, start: int = 0
    ) -> tuple[list[Attempt], dict[str, Callable[..., Any]], Timing | None]:
        """Attempts for backends[start:], the passing callables, and eager's timing."""
        attempts: list[Attempt] = []
        passed: dict[str, Callable[..., Any]] = {}
        slow: dict[str, Callable[..., Any]] = {}  # below min_speedup: for the rescue
        floored: dict[str, Callable[..., Any]] = {}  # measurably slower than eager
        eager: Timing | None = None
        eager_of: dict[str, Timing] = {}  # first mode: each candidate's own run's eager
        shape = graphinfo.graph_hash(gm)
        why_not_graphs = self.graphs.why_not(gm, inputs)
        raced = self._raced(inputs, reference)
        for backend in self.backends[start:]:
            if passed and self.mode == "first":
                attempts.append(Attempt(backend.name, Status.NOT_TRIED, "a backend earlier won"))
                continue
            attempt, fn = self.attempt(backend, backend, gm, inputs, reference)
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
                if backend.name == EAGER and eager is not None:  # eager itself, timed already:
                    timings = {EAGER_REF: eager, EAGER: eager}  # one eager time per graph
                    attempt = timed_by(attempt, eager)
                else:
                    [attempt], timings = time_candidates(
                        self.speed, [attempt], {backend.name: fn}, gm, reference
                    )
                eager = eager_of[backend.name] = timings[EAGER_REF]
                attempt, fn = self.speed.judge(
                    attempt, fn, self._last(backend), timings, slow, floored, raced
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
            attempts, timings = time_candidates(self.speed, attempts, passed, gm, reference)
            eager = timings.get(EAGER_REF)
        if self.mode == "fastest":
            attempts = self.speed.pick_fastest(attempts, eager)
            if self.regions and self._timed(reference) and start == 0:  # chain.select.regions
                attempts, passed = mix(self, gm, inputs, reference, attempts, passed)
        elif not passed:
            attempts = self.speed.rescue_slower(attempts, slow, passed)
        attempts = self.speed.explained(attempts)  # the winner's reason: its speed case
        won = next((a.backend for a in attempts if a.status is Status.WON), None)
        eager = eager_of.get(won or "", eager)  # the graph's one eager time: its winner's run
        if self.speed.floor_needed(attempts):
            attempts.append(self.speed.floor_attempt(eager))
            passed[EAGER] = gm.forward
        # the verified losers too: the run-time race's challengers (chain.select.racing)
        return attempts, {**slow, **floored, **passed}, eager

    def _raced(self, inputs: list[Any], reference: Reference) -> bool:
        """Whether the graph's run-time race will go on (chain.select.racing): recorded
        inputs, measured, and not a symbolic graph that shape buckets serve."""
        if why_not_raced(self.speed.measure, reference) is not None:
            return False
        return not (self.buckets and concretize(inputs).symbolic)

    def attempt(
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
                timeout_s=None if compiler.name == EAGER else self.speed.stall_s,
                strict=self.speed.strict,
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
        attempt, fn = self.graphs.tried(*self.attempt(variant, backend, gm, inputs, reference))
        if fn is None or self.mode == "fastest":
            attempts.append(attempt)
            if fn is not None:
                passed[variant.name] = fn
            return None
        plain, eager = attempts.pop(), None
        if backend.name not in passed:  # plain lost on speed: the variant is timed on its own
            if self._timed(reference):
                [attempt], timings = time_candidates(
                    self.speed, [attempt], {variant.name: fn}, gm, reference
                )
                eager = timings[EAGER_REF]
                attempt, fn = self.speed.judge(attempt, fn, self._last(backend), timings, *lost)
            if fn is not None:
                passed[variant.name] = fn
            attempts += [plain, attempt]
            return eager
        if self._timed(reference):
            fns = {backend.name: passed[backend.name], variant.name: fn}
            pair, timings = time_candidates(self.speed, [plain, attempt], fns, gm, reference)
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

    def index(self, name: str) -> int:
        """Position in the chain of the backend an attempt belongs to (variants too); the
        eager floor sits after the last one."""
        names = [b.name for b in self.backends]
        base = base_name(name)
        return names.index(base) if base in names else len(names)

    def _last(self, backend: Backend) -> bool:
        """The chain's last backend: exempt from min_speedup (it is the last resort)."""
        return backend is self.backends[-1]

    def _timed(self, reference: Reference) -> bool:
        """Whether candidates are timed: measure=True and the graph can be run here."""
        return self.speed.measure and reference.runnable
