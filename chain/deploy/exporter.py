"""`chain.export(model, args)`: capture, run the chain, and build a deployable ExportedProgram.

1. `torch.export` captures the model as one ATen graph (`capture.py`).
2. The chain runs on that graph as dynamo would call it; its report records the attempts.
3. The winner's compiled parts become `backend_chain::run_payload` calls:
   tensorrt: each engine; onnxruntime: the whole ONNX model it verified; when ONNX Runtime
   declined the whole graph (an op it has no translation for), ORT parts and PyTorch parts
   (`partition.py`); any other winner: the program stays PyTorch.
4. torch.export traces the stitched module: PyTorch parts are inlined, parameters, buffers
   and payload constants lifted as torch.export does. The result is checked against eager.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

from backends.tensorrt.partitioning.partitioner import summarize
from chain.core import Chain
from chain.deploy.capture import capture
from chain.deploy.engines import onnxruntime_whole, tensorrt_parts
from chain.deploy.partition import ort_parts
from chain.deploy.stitch import CompiledPart, stitch
from chain.records import Status
from chain.report import Report
from chain.verify import compare

DEFAULT_BACKENDS = ("tensorrt", "onnxruntime", "eager")


class ExportError(RuntimeError):
    """The exported program does not reproduce the model (a bug: please report it)."""


@dataclass
class ExportResult:
    """The program, the chain's report, and what each compiled part holds.

    Unpacks as a pair: `program, report = chain.export(model, args)`.
    """

    program: torch.export.ExportedProgram
    report: Report
    parts: list[dict[str, Any]] = field(default_factory=list)
    fallback: dict[str, dict[str, int]] = field(default_factory=dict)

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
) -> ExportResult:
    """Export `model` with its compiled parts inside; `backend` defaults to
    chain("tensorrt", "onnxruntime", "eager").

    `torch_executed_ops` ("aten.relu", ...) and `min_block_size` shape the ORT partitions
    made when ONNX Runtime cannot take the whole graph. Raises `CaptureError` when
    torch.export cannot capture the model as one graph.
    """
    the_chain = _as_chain(backend)
    captured = capture(model, tuple(args), kwargs, strict=strict)
    gm, flat = captured.gm, captured.flat_inputs
    with torch.no_grad():
        guard = the_chain(gm, flat)
        record = the_chain.report.graphs[guard.graph_id]
        built = _compiled_parts(gm, flat, guard, record, torch_executed_ops, min_block_size)
    staged, parts, fallback, note = built
    stitched = stitch(staged, parts)
    stitched.graph._codegen = captured.codegen
    stitched.recompile()
    with torch.no_grad():
        program = torch.export.export(stitched, tuple(args), dict(kwargs or {}), strict=False)
    _check(model, program, args, kwargs)
    the_chain.report.graphs[record.id] = dataclasses.replace(record, notes=(*record.notes, note))
    return ExportResult(program, the_chain.report, [p.summary() for p in parts.values()], fallback)


def _compiled_parts(
    gm: fx.GraphModule,
    flat: list[Any],
    guard: Any,
    record: Any,
    torch_executed_ops: Sequence[str],
    min_block_size: int,
) -> tuple[fx.GraphModule, dict[str, CompiledPart], dict[str, dict[str, int]], str]:
    """The graph to stitch, its parts, the ops left to PyTorch (with reasons), a report note."""
    winner = record.winner
    if winner == "tensorrt":
        staged, parts = tensorrt_parts(guard.fn, flat)
        return staged, parts, {}, f"export: {len(parts)} TensorRT engine(s)"
    if winner == "onnxruntime" and not torch_executed_ops:
        whole = onnxruntime_whole(gm, guard.fn, flat)
        if whole is not None:
            return *whole, {}, "export: the whole graph as one ONNX Runtime model"
    ort = next((a for a in record.attempts if a.backend == "onnxruntime"), None)
    if ort is not None and (
        ort.status is Status.UNSUPPORTED or (winner == "onnxruntime" and torch_executed_ops)
    ):
        staged, parts, result = ort_parts(
            gm, flat, torch_executed_ops=torch_executed_ops, min_block_size=min_block_size
        )
        note = (
            f"export: {len(parts)} ONNX Runtime part(s) ({result.ops_tensorrt} of "
            f"{result.ops_total} ops); PyTorch kept {summarize(result.fallback) or 'nothing'}"
        )
        return staged, parts, result.fallback, note
    return gm, {}, {}, f"export: runs in PyTorch ({winner} won the graph)"


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
    verdict = compare(pytree.tree_leaves(expected), pytree.tree_leaves(actual))
    if verdict.reason is not None:
        raise ExportError(f"exported program differs from the model: {verdict.reason}")
