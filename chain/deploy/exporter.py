"""`chain.export(model, args)`: capture, run the chain, and build a deployable ExportedProgram.

1. `torch.export` captures the model as one ATen graph (`capture.py`).
2. The chain runs on that graph as dynamo would call it; its report records the attempts.
3. Export hooks (`backends.common.parts`) turn compiled parts into payloads: first the
   winner's exporter with its compiled graph, then, if it had nothing to export (or raised
   `Unsupported`, whose reason the notes keep), each other
   exportable backend of the chain, told how it fared (ONNX Runtime partitions a graph it
   declined into ORT parts and PyTorch parts). No exporter: the program stays PyTorch.
4. Every part is verified: its payload, run by its backend's loader, must reproduce the
   outputs the exporter recorded for it.
5. The parts' submodule calls become `backend_chain::run_payload` calls (`stitch.py`), and
   torch.export traces the stitched module: PyTorch parts are inlined, parameters, buffers
   and payload constants lifted as torch.export does. The result is checked against eager.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

import chain.deploy.ops as ops
from backends.common.parts import ExportedParts, ExportRequest, Part
from backends.errors import Unsupported
from backends.registry import registry
from chain.deploy.capture import capture
from chain.deploy.mixed import mixed_parts
from chain.deploy.stitch import stitch
from chain.deploy.structure import structure_notes, without_sample_inputs
from chain.judge.accuracy import reduction_lengths
from chain.judge.fp64 import fp64_reference
from chain.judge.rounds import measure
from chain.judge.verify import compare
from chain.report.records import Attempt, GraphRecord, Status
from chain.report.regions import REGIONS
from chain.report.report import Report
from chain.select.core import Chain

DEFAULT_BACKENDS = ("tensorrt", "onnxruntime", "eager")


class ExportError(RuntimeError):
    """The exported program does not reproduce the model (a bug: please report it)."""


@dataclass
class ExportResult:
    """The program, the chain's report, and what each compiled part holds.

    Unpacks as a pair: `program, report = chain.export(model, args)`. `notes` say what
    export did (which backend it exported when the winner could not be, the parts made).
    """

    program: torch.export.ExportedProgram
    report: Report
    parts: list[dict[str, Any]] = field(default_factory=list)
    fallback: dict[str, dict[str, int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def __iter__(self) -> Iterator[Any]:
        return iter((self.program, self.report))


def _as_chain(backend: Chain | str | Sequence[Any] | None) -> Chain:
    if backend is None:
        return Chain(*DEFAULT_BACKENDS)
    if isinstance(backend, Chain):
        return backend
    if isinstance(backend, str):
        return Chain(backend)
    return Chain(*backend)


def export(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    backend: Chain | str | Sequence[Any] | None = None,
    *,
    torch_executed_ops: Sequence[str] = (),
    min_block_size: int = 1,
    strict: bool = False,
    dynamic_shapes: Any = None,
) -> ExportResult:
    """Export `model` with its compiled parts inside; `backend` defaults to
    chain("tensorrt", "onnxruntime", "eager").

    `torch_executed_ops` ("aten.relu", ...) and `min_block_size` shape the ORT partitions
    made when ONNX Runtime cannot take the whole graph. `dynamic_shapes` is torch.export's
    (`{"x": {0: Dim("batch", max=64)}}`): the program and its ONNX parts take those sizes.
    Raises `CaptureError` when torch.export cannot capture the model as one graph, and
    `TypeError` when `args` is not a tuple (torch.export's rule).
    """
    if not isinstance(args, tuple):  # as torch.export: a lone tensor is not iterated
        raise TypeError(
            f"chain.export expects `args` to be a tuple of example positional inputs (as "
            f"torch.export does), got {type(args).__name__}: pass (x,) for one input"
        )
    the_chain = _as_chain(backend)
    captured = capture(model, tuple(args), kwargs, strict=strict, dynamic_shapes=dynamic_shapes)
    gm, flat = captured.gm, captured.flat_inputs
    with torch.no_grad():
        guard = the_chain(gm, flat)
        record = the_chain.report.graphs[guard.graph_id]
        exported, used, summaries, mixed = None, None, None, None
        if record.winner == REGIONS:  # each region by its backend (chain.deploy.mixed)
            try:
                exported, summaries = mixed_parts(
                    guard.fn, tuple(flat), record, verify, _verify_all, captured.dynamic_dims
                )
            except Unsupported as why:
                mixed = f"export: the mixed regions not exported ({why.reason})"
        if exported is None:
            exported, used = _exported_parts(
                gm,
                tuple(flat),
                guard.fn,
                record,
                frozenset(torch_executed_ops),
                min_block_size,
                captured.dynamic_dims,
            )
        for part in exported.parts.values():
            _verify_all(part)
    stitched = stitch(exported.gm, exported.parts)
    notes = [] if used is None else [_instead(record, used, gm, stitched, tuple(flat))]
    stitched.graph._codegen = captured.codegen
    stitched.recompile()
    with torch.no_grad():
        program = torch.export.export(
            stitched,
            tuple(args),
            dict(kwargs or {}),
            dynamic_shapes=dynamic_shapes,
            strict=False,
        )
    _check(model, program, args, kwargs)
    notes = [*notes, *([mixed] if mixed else []), exported.note, *structure_notes(program),
             *without_sample_inputs(program)]  # fmt: skip
    the_chain.report.graphs[record.id] = dataclasses.replace(record, notes=(*record.notes, *notes))
    summaries = summaries or [p.summary() for p in exported.parts.values()]
    return ExportResult(program, the_chain.report, summaries, exported.fallback, notes)


def _exported_parts(
    gm: fx.GraphModule,
    flat: tuple[Any, ...],
    compiled: Any,
    record: GraphRecord,
    torch_executed_ops: frozenset[str],
    min_block_size: int,
    dynamic_dims: dict[int, tuple[int, ...]],
) -> tuple[ExportedParts, Attempt | None]:
    """The parts of the first candidate (`export_order`) whose exporter returns some, and
    that candidate's attempt when it is not the winner."""
    winner = record.winner
    declined: list[str] = []  # why an exporter made nothing (it raised Unsupported)
    for attempt in export_order(record):
        name = attempt.backend
        won = name == winner
        request = ExportRequest(
            gm,
            flat,
            compiled if won else None,
            str(attempt.status),
            verify,
            torch_executed_ops,
            min_block_size,
            dynamic_dims,
        )
        try:
            exported = registry.lookup(name).exporter(request)  # type: ignore[misc]
        except Unsupported as why:
            declined.append(f"{name} not exported: {why.reason}")
            continue
        if exported is None:  # the hook has nothing of this graph: say how it fared
            how = f": {one_line_reason(attempt.reason)}" if attempt.reason else ""
            declined.append(f"{name} not exported: {attempt.status.value} here{how}")
            continue
        if exported is not None:
            if declined:
                exported.note += f" ({'; '.join(declined)})"
            return exported, (None if won else attempt)
    why = "".join(f"; {d}" for d in declined)
    return ExportedParts(gm, {}, f"export: runs in PyTorch ({winner} won the graph{why})"), None


def one_line_reason(reason: str, limit: int = 160) -> str:
    """An attempt's reason cut to one short line for a note."""
    line = reason.splitlines()[0] if reason else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _exportable(name: str) -> bool:
    return name in registry and registry.lookup(name).exporter is not None


def export_order(record: GraphRecord) -> list[Attempt]:
    """The attempts whose backends can export, in the order export asks them: the winner;
    unless the winner is eager (PyTorch by choice), the candidates that passed and are not
    measurably slower than eager, fastest first, then those the chain did not try (in the
    chain's order); last, those that declined the graph (they may take parts of it)."""
    attempts = [a for a in record.attempts if _exportable(a.backend)]
    won = [a for a in attempts if a.backend == record.winner]
    others = [a for a in attempts if a.backend != record.winner]
    passed: list[Attempt] = []
    untried: list[Attempt] = []
    if record.winner != "eager":
        passed = sorted(
            (a for a in others if a.status is Status.SLOWER and a.verdict != "slower"),
            key=lambda a: math.inf if a.latency_ms is None else a.latency_ms,
        )
        untried = [a for a in others if a.status is Status.NOT_TRIED]
    declined = [a for a in others if a.status is Status.UNSUPPORTED]
    return [*won, *passed, *untried, *declined]


def _instead(
    record: GraphRecord,
    used: Attempt,
    gm: fx.GraphModule,
    stitched: fx.GraphModule,
    flat: tuple[Any, ...],
) -> str:
    """`inductor won; exported onnxruntime, 3.0x`: the note when the winner could not
    export. A candidate the chain did not time is timed here against eager (when the chain
    measures at all), on the stitched graph, as the program will run."""
    name, winner = used.backend, record.winner
    speedup = used.speedup
    if speedup is None and record.eager_ms is not None:
        with torch.no_grad():
            timed = measure({"eager": gm, name: stitched}, flat, baseline="eager")
        speedup = timed[name].speedup
    how = f", {speedup:.1f}x" if speedup is not None else ""
    if used.status is Status.UNSUPPORTED:
        return f"{winner} won; exported {name}{how} (parts: {name} declined the whole graph)"
    if used.status is Status.NOT_TRIED:
        when = "timed at export" if how else "verified at export, not timed"
        return f"{winner} won; exported {name}{how} (the chain did not try it: {when})"
    return f"{winner} won; exported {name}{how}"


def verify(part: Part) -> str | None:
    """None when the part's payload, run by its backend's loader, reproduces `expected`."""
    inputs = part.inputs
    device = next((t.device for t in inputs if isinstance(t, torch.Tensor)), None)
    if device is None:
        device = part.expected[0].device if part.expected else torch.device("cpu")
    runner = ops.preload(part.header, part.body, device)
    actual = tuple(runner(inputs))
    # layout=False: the program's later nodes were traced on the part's own (contiguous)
    # outputs, so eager's channels_last does not matter here; values must match
    if part.graph is None:  # only the part's own outputs: by dtype tolerances
        return compare(tuple(part.expected), actual, layout=False).reason
    # selection's rule: the error against float64 within a multiple of eager's own
    fp64, _ = fp64_reference(part.graph, part.example_inputs)
    fp64 = tuple(pytree.tree_leaves(fp64)) if fp64 is not None else None
    reductions = reduction_lengths(part.graph)
    if fp64 is None or len(fp64) != len(part.expected) or len(reductions) != len(fp64):
        return compare(tuple(part.expected), actual, layout=False).reason
    verdict = compare(tuple(part.expected), actual, fp64=fp64, reductions=reductions, layout=False)
    return verdict.reason


def _verify_all(part: Part) -> None:
    """Raise ExportError when a part an exporter returned does not reproduce its outputs."""
    reason = verify(part)
    if reason is not None:
        raise ExportError(
            f"compiled part {part.name} ({part.header.describe()}) differs from what it "
            f"replaces: {reason}"
        )


def _check(
    model: torch.nn.Module,
    program: torch.export.ExportedProgram,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None,
) -> None:
    """Run the program once and compare with the model: an export is never silently wrong."""
    with torch.no_grad():
        expected = model(*args, **(kwargs or {}))
        actual = program.module()(*args, **(kwargs or {}))
    # layout=False: a part returns contiguous memory where the model may return channels_last
    # (ConvNeXt); the program's own later nodes were traced on that layout; values must match
    verdict = compare(pytree.tree_leaves(expected), pytree.tree_leaves(actual), layout=False)
    if verdict.reason is not None:
        raise ExportError(f"exported program differs from the model: {verdict.reason}")
