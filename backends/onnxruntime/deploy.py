"""ONNX Runtime's export hooks: the ONNX models it verified as payloads, and their loader.

Exporter: when ONNX Runtime won the graph, its whole ONNX model is one part (unless the
runner froze inputs, derived sizes, took symbolic ints or inlined scalars, which a payload
cannot feed: the graph is then exported again whole, then in parts, the reason in the note;
or the user keeps ops in PyTorch); when it passed but lost, or was not tried, because another
backend won (one that cannot export), or when the program takes dynamic shapes, the graph
is exported whole now and verified; when it declined the graph (an op it has no
translation for), or `torch_executed_ops` keeps ops in PyTorch, or the whole export fails,
the graph is partitioned into ORT parts and PyTorch parts (`partition.py`). Loader: a
session on the model behind the backend's zero-copy runner, after checking that this
onnxruntime can run its opset.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from backends.common.onnx_export import OnnxGraph
from backends.common.ort_session import session_options
from backends.common.partitioner import PartitionOptions, summarize
from backends.common.parts import (
    WHOLE,
    ExportedParts,
    ExportRequest,
    Part,
    Runner,
    as_single_call,
    flat_outputs,
)
from backends.common.payload import (
    CPU_EXTRA,
    GPU_EXTRA,
    Header,
    PayloadError,
    PayloadMismatch,
    RuntimeMissing,
    TensorSpec,
    digest,
    installed_version,
    version_tuple,
)
from backends.errors import Unsupported
from backends.onnxruntime.partition import export_part, ort_parts
from backends.onnxruntime.runtime import Compiled, OrtRunner, cpu_run
from backends.onnxruntime.runtime import OutputSpec as BoundOutput
from backends.onnxruntime.session import create_session, default_providers

NAME = "onnxruntime"


def onnx_header(graph: OnnxGraph, outputs: Sequence[torch.Tensor], device: str) -> Header:
    """The header of an exported ONNX model run by this onnxruntime."""
    import onnxruntime

    return Header(
        backend=NAME,
        version=str(onnxruntime.__version__),
        sha256=digest(graph.model),
        input_names=graph.input_names,
        output_names=graph.output_names,
        outputs=tuple(TensorSpec.of(t) for t in outputs),
        opset=graph.opset,
        device=device,
    )


def export_parts(request: ExportRequest) -> ExportedParts | None:
    """The exporter hook: the whole model when ORT won, or did not lose by failing (another
    winner cannot export); ORT parts when it declined the graph or ops stay in PyTorch.
    A winner that cannot be a payload as it is (frozen, derived or carried inputs, inlined
    scalars) is exported again whole, then in parts; each step's reason goes in the note."""
    if request.status == "unsupported":
        return partitioned(request, "whole graph: onnxruntime declined it")
    if not request.won and not request.untaken:
        return None  # it failed on this graph (mismatch, errors): nothing of it is exported
    if request.torch_executed_ops:
        return partitioned(request)
    if request.won and not request.dynamic_dims:
        why = not_a_payload(request.compiled)
        if why is None:
            return whole_model(request)
        return exported_whole(request, f"the winning model {why}")
    return exported_whole(request)


def exported_whole(request: ExportRequest, first: str = "") -> ExportedParts:
    """The graph exported whole now (for its dynamic axes, for a backend that did not win
    it, or for a winner whose model is no payload: `first` says why), verified; ORT parts
    when it does not export or verify whole."""
    gm, flat = request.gm, request.flat_inputs
    with torch.no_grad():
        out = gm(*flat)
    dynamic = bool(request.dynamic_dims)
    try:
        part = export_part(WHOLE, gm, flat, out, onnx_header, dynamic)
        reason = request.verify(part)
    except Unsupported as error:
        reason = error.reason
    if reason is not None:
        why = f"{first}; " if first else ""
        return partitioned(request, f"{why}whole graph: {reason}")
    axes = f" with dynamic axes {dict(request.dynamic_dims)}" if dynamic else ""
    note = f"export: the whole graph as one ONNX Runtime model{axes}"
    if first:
        note += f", exported again ({first})"
    return ExportedParts(as_single_call(gm), {WHOLE: part}, note)


def not_a_payload(runner: Any) -> str | None:
    """Why the winning runner's ONNX model cannot be a payload as it is, or None: a payload
    is fed the graph's tensors in order and nothing else."""
    if not isinstance(runner, OrtRunner):
        return f"is a {type(runner).__name__}, not an ONNX Runtime runner"
    graph = runner.graph
    reads = (
        (graph.frozen, "froze inputs"),
        (graph.derived, "reads sizes of inputs"),
        (graph.carriers, "takes symbolic ints"),
        (tuple(graph.fixed), "inlined fixed ints"),
        (tuple(graph.scalars), "inlined module scalars"),
        (graph.mutated, "writes to inputs"),
    )
    found = [f"{what} {list(positions)[:4]}" for positions, what in reads if positions]
    return f"{', '.join(found)}" if found else None


def whole_model(request: ExportRequest) -> ExportedParts:
    """The winning runner's ONNX model as one part (`not_a_payload` said it can be)."""
    runner = request.compiled
    graph = runner.graph  # type: ignore[union-attr]
    gm, flat = request.gm, request.flat_inputs
    with torch.no_grad():
        outputs, _ = flat_outputs(gm(*flat))
    device = next((t.device for t in flat if isinstance(t, torch.Tensor)), None)
    part = Part(
        name=WHOLE,
        header=onnx_header(graph, outputs, device.type if device is not None else "cpu"),
        body=graph.model,
        input_positions=graph.input_positions,
        returns_tuple=True,
        ops=sum(1 for n in gm.graph.nodes if n.op == "call_function"),
        example_inputs=flat,
        expected=tuple(outputs),
        graph=gm,
    )
    note = "export: the whole graph as one ONNX Runtime model"
    return ExportedParts(as_single_call(gm), {WHOLE: part}, note)


def partitioned(request: ExportRequest, why: str = "") -> ExportedParts:
    """ORT parts for what the exporter translates, PyTorch parts (with reasons) for the rest;
    `why` says why the graph is not one part (when it could have been)."""
    options = PartitionOptions(
        min_block_size=request.min_block_size, torch_executed_ops=request.torch_executed_ops
    )
    split, parts, result = ort_parts(
        request.gm,
        request.flat_inputs,
        options,
        onnx_header,
        request.verify,
        bool(request.dynamic_dims),
    )
    note = (
        f"export: {len(parts)} ONNX Runtime part(s) ({result.ops_compiled} of "
        f"{result.ops_total} ops); PyTorch kept {summarize(result.fallback) or 'nothing'}"
    )
    if why:
        note += f" ({why})"
    return ExportedParts(split, parts, note, result.fallback)


def check_onnxruntime(header: Header, installed: str | None) -> None:
    """ORT must be present and not older (major.minor) than the one that verified the model."""
    if installed is None:
        raise RuntimeMissing(
            f"this program has an ONNX model built with {header.describe()}, and onnxruntime "
            f"is not installed: {CPU_EXTRA} (or {GPU_EXTRA} on GPU machines)"
        )
    if version_tuple(installed)[:2] < version_tuple(header.version)[:2]:
        raise PayloadMismatch(
            f"ONNX model built and verified with {header.describe()}, this process has "
            f"onnxruntime {installed}, which may not run its opset: pip install -U onnxruntime "
            "(or export again with this onnxruntime)"
        )


def refuse_external_data(header: Header, body: bytes) -> None:
    """Raise PayloadError when the model reads tensors from files outside the payload.

    ONNX Runtime resolves external-data paths against the current directory: a payload
    must carry all of its weights, so that loading a program reads nothing else.
    """
    import onnx
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    try:
        model = onnx.load_model_from_string(body)
    except Exception as error:  # protobuf's DecodeError has no stable import path
        raise PayloadError(f"{header.describe()} payload is not an ONNX model: {error}") from None
    external = [t.name for t in _get_all_tensors(model) if uses_external_data(t)]
    if external:
        raise PayloadError(
            f"ONNX model built with {header.describe()} reads {len(external)} tensor(s) from "
            f"external data files ({', '.join(external[:3])}): refused, a payload must "
            "carry its weights"
        )


def load_payload(header: Header, body: bytes, device: torch.device) -> Runner:
    """The loader hook: an ORT session on `body` behind the backend's zero-copy runner."""
    check_onnxruntime(header, installed_version("onnxruntime"))
    refuse_external_data(header, body)
    graph = OnnxGraph.of_model(body, header.input_names, header.output_names, header.opset or 0)
    try:
        session = create_session(body, session_options(), default_providers(device))
    except Unsupported as error:
        raise PayloadMismatch(
            f"onnxruntime {installed_version('onnxruntime')} cannot load the ONNX model built "
            f"with {header.describe()}: {error.reason}"
        ) from error
    if device.type == "cpu":
        return _CpuRun(session, header.input_names, header.output_names)
    runner = OrtRunner(
        Compiled(graph, session, ()),
        device=device,
        outputs=[
            BoundOutput(o.shape if o.static else None, o.torch_dtype)  # type: ignore[arg-type]
            for o in header.outputs
        ],
        single_output=False,
        rebuild=None,
    )

    def run(inputs: Sequence[Any]) -> list[torch.Tensor]:
        return list(runner(*[t.contiguous() for t in inputs]))

    return run


_numpy = torch.Tensor.numpy


class _CpuRun:
    """`session.run` on numpy views of the inputs, outputs wrapped without a copy.

    A payload has no frozen weights, scalars or written inputs (`OnnxGraph.of_model`), so
    this is all `OrtRunner` would do on CPU, without its per-call checks. `session` is
    there for inspection (the benchmark checks its options against a direct session's).
    """

    def __init__(self, session: Any, inputs: Sequence[str], outputs: Sequence[str]) -> None:
        self.session = session
        self._names = list(outputs)
        self._feeds = tuple(inputs)
        self._run = cpu_run(session)

    def __call__(self, args: Sequence[Any]) -> list[torch.Tensor]:
        # detached: an input may require grad (an activation from upstream); the op has no
        # gradient, and numpy() refuses such tensors
        fed = {n: t.detach().contiguous().numpy() for n, t in zip(self._feeds, args, strict=True)}
        return [torch.from_numpy(o) for o in self._run(self._names, fed, None)]

    def numpy_parts(self) -> tuple[Any, list[str], tuple[str, ...]]:
        """(the session's run, output names, input names): what `chain.deploy.numpy_call`
        calls on numpy views it has checked, with no frame of ours per call."""
        return self._run, self._names, self._feeds

    def plain(self, args: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The call for CPU tensors that need no gradient (`chain.deploy.direct` checks):
        numpy views straight in (ORT reads strided ones right). ORT's outputs are its own
        memory, never an input's (it copies an output that is a graph input)."""
        fed = dict(zip(self._feeds, map(_numpy, args), strict=True))  # no comprehension frame
        return list(map(torch.from_numpy, self._run(self._names, fed, None)))
