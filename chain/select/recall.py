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
from backends.registry import Backend, offered_later
from chain.judge.speed import EAGER, not_decided
from chain.memory import Recall, hit_note, miss_note, replay
from chain.report.records import Attempt, GraphRecord, Status
from chain.run.graphs import base_name
from chain.select import deferred
from chain.select.attempt import Reference


class Remembered:
    """Remembered methods of the Chain (chain.select.core.Chain): they read its options and
    state as `self`."""

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
        fresh, fn = self._try(compiler, backend, gm, inputs, reference)  # type: ignore[arg-type]
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
        names = [b.name for b in self.backends]
        if self.memory is None or winner is None or base_name(winner.backend) not in names:
            return None
        backend = self.backends[names.index(base_name(winner.backend))]
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
        start = time.perf_counter()
        try:  # its part on this thread (inductor: the export); the build runs later
            build = later()
        except Unsupported as error:
            why = f"not built ({error.reason})"
            kept = self.memory.remember_no_artefact(recall, backend.name, why)
            return f"memory: {backend.name}'s package {why}" + (f" ({kept})" if kept else "")
        deferred.submit(
            deferred.Build(
                chain=self,
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
            )
        )
        return (
            f"memory: {backend.name}'s package is being built in the background (exported "
            f"here in {time.perf_counter() - start:.2f} s; compiled in a child process, off "
            "your calls); the next process loads it if it passes"
        )
