"""Whether a graph's selection goes on as a race while the model serves, and how each of
the race's events changes the graph's record (chain.judge.race decides; chain.run.race runs).

A graph races when its decision compared speeds and is not decided enough to remember
(an undecided verdict against eager, or noisy timings: `chain.judge.speed.not_decided`):
the winner serves and every other verified candidate, eager among them, challenges it on
sampled calls. Challengers compiled at the graph's second call (chain.select.challenge)
join the race, or start one. Not raced: graphs that write their inputs, graphs served by shape
buckets, and chains that do not measure (`measure=False`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import fx

from backends.registry import Artefact, Backend
from chain.judge.race import PROMOTED, Race, RaceEvent
from chain.judge.speed import EAGER, not_decided
from chain.report import graphinfo
from chain.report.records import UNDECIDED, Attempt, GraphRecord, Status
from chain.run.graphs import base_name
from chain.run.guard import _FALLBACK
from chain.run.race import Racer
from chain.select.attempt import Reference, why_not_raced
from chain.select.candidates import Selected, Selection
from chain.select.challenge import challenge, default_challengers
from chain.select.recall import Built, Remembered
from chain.select.records import Records

if TYPE_CHECKING:
    from chain.run.guard import GuardedGraph


@dataclasses.dataclass
class RaceStage:
    """The chain's last stage for a new graph: its race, and its challengers compiled at
    the second call (chain.select.challenge)."""

    records: Records
    selection: Selection
    measure: bool
    challengers: str | tuple[Backend, ...]  # "auto": default_challengers
    compile_timeout_s: float | None
    recall: Remembered  # a settled race is remembered, a refuted decision forgotten

    def start(
        self,
        guard: GuardedGraph,
        gm: fx.GraphModule,
        inputs: list[Any],
        reference: Reference,
        selected: Selected,
    ) -> None:
        """Race the graph's losers where its decision is not settled; arm its challengers."""
        racing = Racing(self, guard.graph_id, gm, reference)
        racing.start(guard, selected.fns, selected.provisional)
        if selected.provisional:
            why = f"memory: the remembered decision is provisional ({selected.provisional})"
            self.records.note(guard.graph_id, f"{why}: its losers race it again")
        if not selected.hit or selected.provisional:  # a provisional hit: its losers again
            note = self._challenge(gm, inputs, reference, guard, racing, selected.hit)
            self.records.note(guard.graph_id, note)

    def _challenge(
        self,
        gm: fx.GraphModule,
        inputs: list[Any],
        reference: Reference,
        guard: GuardedGraph,
        racing: Racing,
        hit: bool,
    ) -> str | None:
        """The backends after the winner that were not tried (on a remembered decision: its
        verified losers too), and the chain's challengers (on CUDA with their CUDA graphs
        variants), to compile at the second call."""
        record = self.records.report.graphs[guard.graph_id]
        backends = self.selection.backends
        again = (Status.NOT_TRIED, Status.SLOWER) if hit else (Status.NOT_TRIED,)
        tried = {a.backend for a in record.attempts if a.status not in again}
        tried.add(record.winner or "")
        later = [b for b in backends if b.name not in tried]
        if not_decided(record) is None:  # eager lost, with confidence
            later = [b for b in later if b.name != EAGER]
        auto = self.challengers == "auto"
        named = default_challengers([b.name for b in backends]) if auto else self.challengers
        later += [b for b in named if b.name not in tried and b not in later]
        graphs = self.selection.graphs
        if auto and graphs.why_not(gm, inputs) is None:
            variants = [v for b in later if (v := graphs.variant(b)) is not None]
            later += [v for v in variants if v.name not in tried]  # on CUDA: inductor+graphs
        if racing.why_not and later:
            return f"challengers not compiled: {racing.why_not}"
        job = (self.records, self.selection.options, self.compile_timeout_s)
        return challenge(job, guard.graph_id, gm, inputs, reference, guard, later, racing.join)


class Racing:
    """One graph's race as the chain sees it: started, joined, and each event recorded."""

    def __init__(
        self, stage: RaceStage, graph_id: int, gm: fx.GraphModule, reference: Reference
    ) -> None:
        self.stage = stage
        self.records = stage.records
        self.graph_id = graph_id
        self.gm = gm
        self.reference = reference
        self.why_not = why_not_raced(stage.measure, reference)

    def start(
        self,
        guard: GuardedGraph,
        fns: dict[str, Callable[..., Any]],
        provisional: str | None = None,
    ) -> None:
        """Race the graph's verified losers (eager among them) against its winner when its
        decision is not decided enough to remember, or was remembered as provisional."""
        record = self.records.report.graphs[self.graph_id]
        why = not_decided(record) or (provisional and f"remembered as provisional: {provisional}")
        if why is None or record.winner is None or self.why_not or guard.buckets is not None:
            return
        contenders = {**fns, EAGER: fns.get(EAGER, self.gm.forward)}
        won = record.winning_attempt
        noisy = won is not None and won.verdict != UNDECIDED  # decided, but on noisy timing
        self._race(guard, record.winner, contenders, noisy, f"racing at run time: {why}")

    def join(
        self,
        guard: GuardedGraph,
        name: str,
        fn: Callable[..., Any],
        artefact: Artefact | None = None,
    ) -> str:
        """A challenger compiled at the second call joins the race (or starts one); the
        `artefact` it was built from is stored with the decision if it wins it."""
        with _FALLBACK:
            if self.why_not or guard.buckets is not None:
                return f"not raced ({self.why_not or 'the graph is served by shape buckets'})"
            if artefact is not None:
                runs = list(self.reference.runs or ())
                built = Built(base_name(name), artefact, self.gm, runs)
                self.stage.recall.built(self.graph_id, name, built)
            racer = guard.racer
            if racer is not None:
                racer.fns[name] = fn
                racer.race.add(name)
                self.records.save()
                return f"racing it against {racer.race.stats.server}"
            server = guard.winner
            self._race(guard, server, {server: guard.fn, name: fn}, False, None)
            return f"racing it against {server}"

    def _race(
        self,
        guard: GuardedGraph,
        server: str,
        contenders: dict[str, Callable[..., Any]],
        provisional: bool,
        note: str | None,
    ) -> None:
        challengers = [name for name in contenders if name != server]
        if not challengers:
            return
        race = Race(server, challengers, provisional=provisional)
        self.records.change(self.graph_id, race=race.stats)
        self.records.note(self.graph_id, note)
        runs = self.reference.runs or ()
        cuda = any(isinstance(x, torch.Tensor) and x.is_cuda for x in runs)
        copied = self.reference.isolation.copied if self.reference.isolation else ()

        def on_event(event: RaceEvent, fn: Callable[..., Any] | None) -> None:
            with _FALLBACK:  # one writer of the report at a time (a fallback may be writing)
                _record(self.records, self.graph_id, event)
                recall = self.stage.recall
                if event.what == PROMOTED:  # the decision stored is refuted: forgotten
                    why = f"{event.backend} promoted at run time"
                    self.records.note(self.graph_id, recall.forget(self.graph_id, why))
                if race.stats.state == "decided":  # settled on quiet evidence: remembered
                    self.records.note(self.graph_id, recall.confirm(self.graph_id))
                if fn is not None:
                    index = self.stage.selection.index(event.backend)
                    guard.switch(fn, index, event.backend)
                if race.over:
                    guard.racer = None

        once = graphinfo.writes_placeholders(self.gm)  # writes that changed nothing then
        guard.racer = Racer(
            race, contenders, copied, on_event, self.reference.tolerances, cuda, once
        )


def _record(records: Records, graph_id: int, event: RaceEvent) -> None:
    """A promotion makes the challenger the graph's winner (the old one: slower, with the
    race's evidence); the report file is rewritten. Other events live in the race's stats."""
    if event.what != PROMOTED:
        records.save()
        return
    record: GraphRecord = records.report.graphs[graph_id]
    old = record.winner
    attempts = [
        dataclasses.replace(a, status=Status.SLOWER, reason=f"lost the run-time race: {event}")
        if a.backend == old and a.status is Status.WON
        else dataclasses.replace(a, status=Status.WON, reason=f"won the run-time race: {event}")
        if a.backend == event.backend
        else a
        for a in record.attempts
    ]
    if not any(a.backend == event.backend for a in attempts):
        attempts.append(Attempt(event.backend, Status.WON, f"won the run-time race: {event}"))
    records.finish(graph_id, tuple(attempts), None)
