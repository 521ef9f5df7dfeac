"""The chain's graph records in one place: each change to a record (a note, its attempts
and winner, its run-time counters) goes through `Records`, which keeps the report (and its
file) up to date."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from torch import fx

from backends.registry import Backend
from chain.judge.timing import Timing
from chain.report import graphinfo
from chain.report.look import capture, trace
from chain.report.records import Attempt, GraphRecord, Status
from chain.report.report import Report
from chain.report.report_file import ReportFile
from chain.run.graphs import mark
from chain.run.guard import _FALLBACK
from chain.select import recompiles


class Records:
    """The report of one chain and the file it is written to (None: no file)."""

    def __init__(
        self, report: Report, report_file: ReportFile | None, backends: tuple[Backend, ...]
    ) -> None:
        self.report = report
        self.report_file = report_file
        self.backends = backends  # their sources go on each record (chain.report.look)

    def open(
        self, gm: fx.GraphModule, inputs: list[Any], notes: Sequence[str | None]
    ) -> GraphRecord:
        """A new graph's record (no attempts yet) with `notes` (those not None), appended to
        the report."""
        compiled = recompiles.current()
        notes = [n for n in (*notes, recompiles.limit_note(compiled)) if n]
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
        return record

    def change(self, graph_id: int, **fields: Any) -> GraphRecord:
        """The one place a record changes: graph `graph_id`'s record with `fields` replaced."""
        record = dataclasses.replace(self.report.graphs[graph_id], **fields)
        self.report.graphs[graph_id] = record
        return record

    def note(self, graph_id: int, *notes: str | None) -> GraphRecord:
        """Graph `graph_id`'s record with `notes` (those not None) added."""
        record = self.report.graphs[graph_id]
        kept = tuple(n for n in notes if n)
        return self.change(graph_id, notes=(*record.notes, *kept)) if kept else record

    def finish(
        self, graph_id: int, attempts: tuple[Attempt, ...], eager: Timing | None
    ) -> GraphRecord:
        """Store the graph's attempts and winner; rewrite the report file if there is one."""
        record = self.report.graphs[graph_id]
        winner = next((a.backend for a in attempts if a.status is Status.WON), None)
        record = self.change(
            graph_id,
            attempts=tuple(mark(a) for a in attempts),
            winner=winner,
            eager_ms=eager.median_ms if eager is not None else record.eager_ms,
            eager_spread_ms=eager.spread_ms if eager is not None else record.eager_spread_ms,
        )
        trace.emit(record)  # TORCH_TRACE: the decision beside dynamo's entries (chain.report.look)
        if self.report_file is not None:  # a failed write is a warning (chain.report.report_file)
            self.report_file.write(self.report)
        return record

    def save(self) -> None:
        """Rewrite the report file, if there is one (one writer at a time)."""
        if self.report_file is not None:
            with _FALLBACK:
                self.report_file.write(self.report)

    def drop(self, graph_id: int) -> None:
        """Forget the record of a compile dynamo restarts (its graph never ran)."""
        if graph_id == len(self.report.graphs) - 1:
            self.report.graphs.pop()

    def saved_s(self, graph_id: int) -> Callable[[str], float | None]:
        """Per winner of the graph: what it saves a call over eager, as selection timed it
        (None: not timed), for the weights' updates to weigh refreshes against."""

        def saved(winner: str) -> float | None:
            record = self.report.graphs[graph_id]
            won = next((a for a in record.attempts if a.backend == winner), None)
            if won is None or won.latency_ms is None or record.eager_ms is None:
                return None
            return (record.eager_ms - won.latency_ms) / 1e3

        return saved

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
