"""A remembered decision at selection (chain.memory): compile its winner alone, or load
its artefact, or keep a new one; and which decisions are not worth keeping."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from backends.errors import Unsupported
from backends.registry import Artefact, Backend, offered_later
from chain.judge.speed import EAGER, not_decided
from chain.memory import Memory, Recall, hit_note, miss_note, replay
from chain.memory.remember import PROVISIONAL
from chain.report.records import Attempt, GraphRecord, Status
from chain.run.callers import CALLERS, may_trace
from chain.run.graphs import base_name
from chain.select import deferred
from chain.select.attempt import Reference
from chain.select.candidates import Selected, Selection
from chain.select.once import Reused
from chain.select.records import Records
from chain.select.regions.mix import REGIONS, rebuilt


@dataclasses.dataclass(frozen=True)
class Pending:
    """What a provisional decision's artefact is built from once the race confirms it."""

    fns: dict[str, Callable[..., Any]]
    gm: fx.GraphModule
    inputs: list[Any]
    reference: Reference


@dataclasses.dataclass(frozen=True)
class Built:
    """A challenger's artefact, kept to store with the decision the race settles on it."""

    backend: str  # the registered backend that loads it (a CUDA graphs variant's base)
    artefact: Artefact
    gm: fx.GraphModule
    inputs: list[Any]


@dataclasses.dataclass
class Remembered:
    """The decision store's stage of selection (chain.memory): look a graph up, compile a
    remembered winner alone, and keep a new decision with its winner's artefact."""

    memory: Memory | None  # None: the store is off
    selection: Selection  # compiles and verifies a remembered winner
    records: Records
    eager_floor: bool
    # the chain's challengers: a decision the run-time race settled on one is served warm
    challengers: tuple[Backend, ...] = ()
    # per graph id: its key, to forget a demoted winner
    _kept: dict[int, Recall] = dataclasses.field(default_factory=dict, init=False)
    _errors: dict[int, list[float | None] | None] = dataclasses.field(
        default_factory=dict, init=False
    )  # eager's errors against float64 per graph, kept with a decision the race settles

    _handoffs: dict[int, deferred.Handoff] = dataclasses.field(default_factory=dict, init=False)
    # a provisional decision's parts, for its artefact once the run-time race confirms it
    # (a process that started busy gets inductor's package too), and its graph's guard
    _pending: dict[int, Pending] = dataclasses.field(default_factory=dict, init=False)
    _guards: dict[int, Any] = dataclasses.field(default_factory=dict, init=False)
    # per graph id, per challenger: the artefact it was built from (chain.select.challenge),
    # stored with the decision if the race settles on it
    _built: dict[int, dict[str, Built]] = dataclasses.field(default_factory=dict, init=False)

    def built(self, graph_id: int, name: str, built: Built) -> None:
        """Challenger `name` of graph `graph_id` races, built from `built.artefact`."""
        if self.memory is not None:
            self._built.setdefault(graph_id, {})[name] = built

    def hand_over(self, graph_id: int, guard: Any) -> None:
        """Graph `graph_id`'s guard, to the artefact building for it (chain.select.deferred):
        a package that times faster than the JIT compile serves this process too."""
        if graph_id in self._pending:  # its artefact comes once the race confirms it
            self._guards[graph_id] = guard
        handoff = self._handoffs.pop(graph_id, None)
        if handoff is not None:
            handoff.guard = guard

    def lookup(self, gm: fx.GraphModule, inputs: list[Any]) -> Recall | None:
        """The store's entry for `gm` on `inputs` (None: the store is off)."""
        return self.memory.recall(gm, inputs) if self.memory is not None else None

    def keep(
        self,
        recall: Recall | None,
        record: GraphRecord,
        selected: Selected,
        gm: fx.GraphModule,
        inputs: list[Any],
        reference: Reference,
        errors: list[float | None] | None,
    ) -> None:
        """Remember a selection's decision (not a hit's: it is stored already) with eager's
        errors against float64, and keep the winner's artefact; notes on the record."""
        if recall is None:
            return
        if self.memory is not None:  # a winner demoted at run time forgets its decision
            self._kept[record.id] = recall
        self._errors[record.id] = errors
        stored = self.memory is not None and not selected.hit  # a selection ran: remember it
        provisional = not_decided(record) if self.eager_floor else None
        if stored and not provisional and (why := self.tie_not_kept(record)):
            stored = False
            record = self.records.note(record.id, why)
        note = None
        if stored:  # noisy or undecided: kept as provisional, raced (chain.select.racing)
            note = self.memory.remember(recall, record, errors, provisional)  # type: ignore[union-attr]
            if provisional and note is None:
                note = (
                    f"memory: remembered as provisional ({provisional}): a warm process serves "
                    "it and races it until quiet evidence confirms or refutes it"
                )
        record = self.records.note(record.id, note)
        decided = selected.hit or (stored and note is None)  # a decision is kept
        if not isinstance(recall, Reused):  # its selection kept what there was to keep
            if stored and not decided:  # provisional: the artefact waits for the race
                self._pending[record.id] = Pending(selected.fns, gm, inputs, reference)
            note = self._keep_artefact(recall, record, selected.fns, gm, inputs, reference, decided)
            self.records.note(record.id, note)

    def confirm(self, graph_id: int) -> str | None:
        """Remember graph `graph_id`'s decision as the run-time race settled it on quiet
        evidence (its winner may be a promoted challenger): no longer provisional."""
        recall = self._kept.get(graph_id)
        if recall is None or self.memory is None:
            return None
        record = self.records.report.graphs[graph_id]
        failed = self.memory.remember(recall, record, self._errors.get(graph_id))
        note = failed or f"memory: {record.winner} remembered, settled by the run-time race"
        built = self._built.pop(graph_id, {}).get(record.winner or "")
        pending, guard = self._pending.pop(graph_id, None), self._guards.pop(graph_id, None)
        if built is not None and not failed:  # a challenger built apart won: its artefact
            stored = self.memory.store_artefact(
                recall, built.backend, built.artefact, built.gm, built.inputs
            )
            kept = f"memory: {built.backend}'s artefact (built for its challenge) stored"
            return f"{note}; {stored or kept + ': a warm start loads it'}"
        if pending is None or failed or record.winner not in pending.fns:
            return note  # not stored, or a challenger compiled later won: no artefact here
        built = self._keep_artefact(
            recall, record, pending.fns, pending.gm, pending.inputs, pending.reference, True
        )
        self.hand_over(graph_id, guard)
        return f"{note}; {built}" if built else note

    def forget(self, graph_id: int, why: str) -> str | None:
        """Forget graph `graph_id`'s stored decision (its winner was demoted): a note, or None
        when nothing was stored for it."""
        self._pending.pop(graph_id, None)
        self._guards.pop(graph_id, None)
        recall = self._kept.get(graph_id)
        if recall is None or self.memory is None:
            return None
        return self.memory.forget(recall, why)

    def tie_not_kept(self, record: GraphRecord) -> str | None:
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

    def compile(
        self,
        gm: fx.GraphModule,
        inputs: list[Any],
        reference: Reference,
        recall: Recall | None,
        graph_id: int,
    ) -> Selected | None:
        """On a remembered decision: compile and verify its winner only (chain.memory).
        None: no decision, or its winner failed now (noted on the record; selection runs)."""
        if recall is None or (decision := recall.decision) is None:
            return None
        names = [b.name for b in self.selection.backends]
        pool = [*self.selection.backends, *(c for c in self.challengers if c.name not in names)]
        if decision.winner == EAGER and EAGER not in names:  # the eager floor: no compile
            fresh, fn = decision.winning_attempt, gm.forward
        elif decision.winner == REGIONS and (decided := decision.winning_attempt) is not None:
            fresh, fn = rebuilt(self.selection, gm, inputs, reference, decided)  # its plan
        elif base_name(decision.winner) in (pooled := [b.name for b in pool]):
            backend = pool[pooled.index(base_name(decision.winner))]
            graphs = self.selection.graphs
            variant = backend if decision.winner == backend.name else graphs.variant(backend)
            fresh, fn, note = self._from_artefact(backend, gm, inputs, reference, recall)
            self.records.note(graph_id, note)
            if fn is None:
                compiler = variant or backend
                fresh, fn = self.selection.attempt(compiler, backend, gm, inputs, reference)
        else:
            fresh, fn = Attempt(decision.winner, Status.UNAVAILABLE, "not in this chain"), None
        attempts = replay(recall, fresh) if fresh is not None and fn is not None else None
        if attempts is None:
            failed = fresh or Attempt(decision.winner, Status.COMPILE_ERROR, "no attempt")
            self.records.note(graph_id, miss_note(recall, failed))
            return None
        self.records.note(graph_id, hit_note(recall))
        self.records.change(
            graph_id, eager_ms=decision.eager_ms, eager_spread_ms=decision.eager_spread_ms
        )
        fns = {a.backend: fn for a in attempts if a.status is Status.WON}
        provisional = decision.extra.get(PROVISIONAL)
        why = str(provisional) if provisional else None
        return Selected(tuple(attempts), fns, None, hit=True, provisional=why)

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
        if self.memory is None or decision is None or backend.reuse is None:
            return None, None, None
        if base_name(decision.winner) != backend.name:
            return None, None, None
        native = backend.native_artefacts
        if (compiler := deferred.reusing(backend, decision.winner, b"")) is None:
            return None, None, None  # a CUDA graphs variant its artefact cannot rebuild
        data, note = self.memory.artefact(recall, backend.name, gm, inputs, native=native)
        if data is None:
            return None, None, note
        compiler = deferred.reusing(backend, decision.winner, data)
        fresh, fn = self.selection.attempt(compiler, backend, gm, inputs, reference)  # type: ignore[arg-type]
        if fn is None:
            return (
                None,
                None,
                (
                    f"memory: {decision.winner} from its stored artefact failed "
                    f"({fresh.status}: {fresh.reason}); compiled as usual"
                ),
            )
        loaded = {"key": recall.key, "bytes": len(data)}
        fresh = dataclasses.replace(fresh, details={**fresh.details, "artefact": loaded})
        skipped = "its compile" if native else "its expensive step (ONNX export, ...)"
        note = (
            f"memory: {backend.name} built from its stored artefact ({len(data) / 2**20:.1f} "
            f"MiB): {skipped} skipped"
        )
        return fresh, fn, note

    def _keep_artefact(
        self,
        recall: Recall,
        record: GraphRecord,
        fns: dict[str, Callable[..., Any]],
        gm: fx.GraphModule,
        inputs: list[Any],
        reference: Reference | None = None,
        decided: bool = False,
    ) -> str | None:
        """Store the winner's artefact with its decision, unless it was loaded from one. An
        artefact offered to build later (inductor's package) is built in the background
        (chain.select.deferred) when the decision is kept (`decided`) and worth it."""
        winner = record.winning_attempt
        names = [b.name for b in self.selection.backends]
        if self.memory is None or winner is None or base_name(winner.backend) not in names:
            return None
        backend = self.selection.backends[names.index(base_name(winner.backend))]
        if "artefact" in winner.details or backend.reuse is None:
            return None
        fn = fns.get(winner.backend)
        if (later := offered_later(fn)) is None:
            if winner.backend != backend.name:
                return None  # a CUDA graphs variant: its artefact is its backend's, made later
            return self.memory.keep_artefact(recall, winner.backend, fn, gm, inputs)
        if not decided or reference is None or self.memory.max_artefact_bytes == 0:
            return None
        if (why := recall.no_artefact(backend.name)) is not None:
            return f"memory: {backend.name}'s package not built: {why}"
        if backend.native_artefacts and (why := self.memory.native_refusal(recall)):
            return f"memory: {backend.name}'s package not built: it could not be loaded ({why})"
        if not may_trace():  # after a race settled it, in a call: other threads are calling
            return f"memory: {backend.name}'s package not built: {CALLERS.why_not()}"
        start = time.perf_counter()
        try:  # its part on this thread (inductor: the export); the build runs later
            build = later()
        except Unsupported as error:
            why = f"not built ({error.reason})"
            kept = self.memory.remember_no_artefact(recall, backend.name, why)
            return f"memory: {backend.name}'s package {why}" + (f" ({kept})" if kept else "")
        handoff = self._handoffs[record.id] = deferred.Handoff()
        deferred.submit(
            deferred.Build(
                memory=self.memory,
                records=self.records,
                options=self.selection.options.get(backend.name, {}),
                speed=self.selection.speed,
                record_id=record.id,
                recall=recall,
                backend=backend,
                winner=winner.backend,
                build=build,
                jit=fn,  # type: ignore[arg-type]
                gm=gm,
                inputs=list(reference.compile_inputs(inputs)),
                reference=deferred.snapshot(reference),
                grad=torch.is_grad_enabled(),
                inference=torch.is_inference_mode_enabled(),
                handoff=handoff,
            )
        )
        return (
            f"memory: {backend.name}'s package is being built in the background (exported "
            f"here in {time.perf_counter() - start:.2f} s; compiled in a child process, off "
            "your calls); the next process loads it if it passes"
        )
