"""Artefacts built after the decision, off the caller's thread: inductor's AOTInductor
package is a second compile (tens of seconds on a small CPU), so the process that selected
(or a warm one that found no package) builds it in the background (`chain.select.background`:
once the process settled, never in a user's call, abandoned at exit after a bounded wait).

A build is marked as a compile itself, so a timing run beside it waits or records it as
noise. It is then treated as a candidate: loaded through the backend's `reuse`, verified
against eager by the chain's rule (`try_backend`), timed against the JIT compile it
replaces, and stored only if it is not measurably slower; timed faster, it serves this
process too (`Handoff`). Every outcome, failures included, is a note on the graph's record;
a failed or slower build is kept with the decision so later processes do not build it
again. A build whose graph a later graph of the same frame recompiled (dynamo's dynamic
graph at the next shape, which serves this one's calls too) waits for its graph's next
call (`_park`). CHAIN_INDUCTOR_PACKAGE=0, or max_artefact_mb=0, builds none.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from backends import cancel
from backends.errors import Unsupported
from backends.registry import Artefact, Backend
from chain.judge.compiles import compiling, lineage, quiet
from chain.judge.rounds import measure
from chain.judge.speed import QUIET_S, UNDECIDED_MORE, SpeedRules
from chain.memory import Memory, Recall
from chain.report.records import Attempt, Status
from chain.run.guard import _FALLBACK
from chain.select.attempt import Reference, try_backend
from chain.select.background import pending, submit, wait
from chain.select.eager_run import current, weights_at
from chain.select.isolation import fresh_copy
from chain.select.records import Records

__all__ = ["JIT", "Build", "Handoff", "pending", "reusing", "snapshot", "submit", "wait"]

JIT = "JIT compile"  # the baseline a built artefact is timed against


def reusing(backend: Backend, winner: str, data: bytes) -> Backend | None:
    """`backend` compiling from its artefact `data` as the `winner` ran: the backend itself,
    or its CUDA graphs variant (`<name>+graphs`) when its `reuse` hook takes
    `cuda_graphs=True` (inductor: its package replayed as CUDA graphs); None otherwise."""
    if backend.reuse is None:
        return None
    if winner == backend.name:
        return backend.reusing(data)
    if "cuda_graphs" not in inspect.signature(backend.reuse).parameters:
        return None
    compiler = functools.partial(backend.reuse, artefact=data, cuda_graphs=True)
    return dataclasses.replace(backend, name=winner, compiler=compiler)


class Handoff:
    """Where a built artefact goes in this process: the graph's guard, handed over once it
    exists. A package timed faster than the JIT compile it replaces (with confidence) serves
    the graph from then on, here and not only in the next process."""

    def __init__(self) -> None:
        self.guard: Any = None  # chain.run.guard.GuardedGraph, set by `Remembered.hand_over`

    def serve(self, jit: Callable[..., Any], fn: Callable[..., Any], winner: str) -> bool:
        """Serve `fn` instead of `jit`, unless the guard is not there yet or serves another
        callable now (the run-time race, a fallback or a weight update switched it)."""
        guard = self.guard
        if guard is None:
            return False
        with _FALLBACK:
            if guard.fn is not jit or guard.damaged is not None:
                return False
            guard.switch(fn, guard.backend_index, winner)
        return True


@dataclass(frozen=True)
class Build:
    """One artefact to build for graph `record_id` of a chain's `records`: `build()` makes
    it, `jit` is the compiled callable of the `winner` (the backend or its CUDA graphs
    variant) it would replace, `reference` what it is verified against; `options` are the
    user's for the backend, `speed` the chain's speed rules."""

    memory: Memory
    records: Records
    options: dict[str, Any]
    speed: SpeedRules
    record_id: int
    recall: Recall
    backend: Backend
    winner: str
    build: Callable[[], Artefact]
    jit: Callable[..., Any]
    gm: fx.GraphModule
    inputs: list[Any]
    reference: Reference
    grad: bool
    inference: bool
    handoff: Handoff | None = None  # where it serves this process when faster
    called_again: bool = False  # queued again by the graph's call after it was parked

    @property
    def what(self) -> str:
        return f"memory: {self.backend.name}'s package build"

    def run(self) -> str:
        return _run(self)

    def failed(self, why: str) -> str:
        return _failed(self, f"its build failed ({why})")


def snapshot(reference: Reference) -> Reference:
    """The reference with its own copies of the activations (the caller may reuse its
    tensors meanwhile) and no weight watch, but the weights' fingerprints: a weight the
    user changes later is theirs to change, and work verified after such a change records
    the reference again on the weights as they are then (`eager_run.current`)."""
    runs = reference.runs
    if runs is not None:
        runs = tuple(
            fresh_copy(x) if i in reference.copied() and isinstance(x, torch.Tensor) else x
            for i, x in enumerate(runs)
        )
    return dataclasses.replace(reference, runs=runs, watch=None, weights=weights_at(reference))


def load_verified(
    backend: Backend,
    winner: str,
    data: bytes,
    gm: fx.GraphModule,
    inputs: list[Any],
    reference: Reference,
    options: dict[str, Any],
) -> tuple[Attempt, Callable[..., Any] | None] | None:
    """`winner` rebuilt by `backend` from its artefact `data` (`reusing`), run and verified
    by the chain's rule (no retry, no time limit: off the caller's thread); None when
    `backend` cannot rebuild `winner` from it."""
    cancel.checkpoint()  # a background job: the process may be leaving (chain.select.background)
    compiler = reusing(backend, winner, data)
    if compiler is None:
        return None
    loaded = try_backend(
        compiler, gm, inputs, reference, options=options, max_retries=0, timeout_s=None,
        strict=False,
    )  # fmt: skip
    cancel.checkpoint()
    return loaded


def _failed(build: Build, why: str) -> str:
    """The note for a build that will not serve: kept with the decision, so later
    processes do not build it again."""
    name = build.backend.name
    memory = build.memory
    kept = memory.remember_no_artefact(build.recall, name, why) if memory is not None else None
    note = f"memory: {name}'s package not stored: {why}; warm starts compile {name} as usual"
    return f"{note} ({kept})" if kept else note


def _run(build: Build) -> str:
    """Build, load, verify, time and store one artefact; the graph's note on the outcome."""
    name = build.backend.name
    if (parked := _park(build)) is not None:
        return parked
    with (
        compiling(f"{name} package"),
        torch.inference_mode(build.inference),
        torch.set_grad_enabled(build.grad),
    ):
        start = time.perf_counter()
        try:
            artefact = build.build()
        except Unsupported as error:
            if cancel.abandoned():
                raise cancel.Cancelled("abandoned at exit") from None
            return _failed(build, f"not built ({error.reason})")
        build_s = time.perf_counter() - start
        cancel.checkpoint()  # the process may be leaving: no torch work here then
        reference, again = current(build.gm, build.reference)
        loaded = load_verified(
            build.backend, build.winner, artefact.data, build.gm, build.inputs, reference,
            build.options,
        )  # fmt: skip
        if loaded is None:
            return _failed(build, f"{build.winner} cannot be rebuilt from it")
        attempt, fn = loaded
        if fn is None or attempt.status is not Status.WON:
            return _failed(build, f"built, then {attempt.status}: {attempt.reason}")
        speed = f"; {again}" if again else ""
        if reference.runnable:
            quiet(QUIET_S, lineage())
            rules = build.speed
            timing = measure(
                {JIT: build.jit, "package": fn},
                reference.inputs(),
                baseline=JIT,
                budget_s=rules.budget_s * (1 + UNDECIDED_MORE),
            )["package"]
            if timing.slower:
                return _failed(build, f"slower than the {JIT} ({timing.interval()})")
            speed = f", {timing.interval()} as fast as the {JIT} ({timing.verdict}){speed}"
            handoff = build.handoff
            if timing.faster and handoff is not None and handoff.serve(build.jit, fn, build.winner):
                speed += f"; it serves this process from now on, in place of the {JIT}"
    memory = build.memory
    stored = memory.store_artefact(build.recall, name, artefact, build.gm, build.inputs)
    if stored is not None:  # too large, weights not hashed: it would fail again
        return _failed(build, stored.removeprefix("memory: "))
    return (
        f"memory: {name}'s package stored ({len(artefact.data) / 2**20:.1f} MiB, built in "
        f"{build_s:.1f} s in the background, verified against eager{speed}): a warm start "
        "loads it, compiling nothing"
    )


def _park(build: Build) -> str | None:
    """Not now when a later graph of the same frame recompiled this one: dynamo tries its
    newest compile first, so a dynamic recompile serves this graph's shapes too (a static
    first graph, then a dynamic one at the next length: the first's package was 30-45 s of
    compile never used). The build waits for this graph's next call (`guard.later`, nothing
    on its fast path); the note says so. None: build now."""
    guard = build.handoff.guard if build.handoff is not None else None
    graphs = build.records.report.graphs
    later = next((g.id for g in graphs if g.recompiles == build.record_id), None)
    if later is None or guard is None or build.called_again:
        return None
    with _FALLBACK:
        waiting = guard.later  # other work for the graph's next call (its challengers)

        def called() -> None:
            if waiting is not None:
                waiting()
            submit(dataclasses.replace(build, called_again=True))

        guard.later = called
    return (
        f"memory: {build.backend.name}'s package not built yet: graph {later} recompiled "
        "this frame and serves its calls; built if this graph is called again"
    )
