"""FX graph module + example inputs -> ONNX model bytes, weights as initializers.

`export_onnx` is the one exporter of the project: the ONNX Runtime backend runs its bytes,
the TensorRT backend parses them per accelerated partition, and export reuses them.
The exporter is `torch.onnx.export(..., dynamo=True)` (torch.export + onnxscript); its
logs are silenced on its thread and its failures become `Unsupported` with one readable line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import fx

from backends import cancel
from backends.common.fx_utils import weight_inputs
from backends.common.onnx_prepare import (
    PreparedGraph,
    module_scalars,
    prepare_graph,
    size_carrier,
    symbolic_dims,
)
from backends.common.quiet import captured_here, filter_noisy_loggers, quiet, quiet_here
from backends.errors import Unsupported, one_line

if TYPE_CHECKING:
    import onnx

T = TypeVar("T")


@dataclass(frozen=True)
class OnnxGraph:
    """An exported graph: ONNX bytes and how the original graph's inputs feed it.

    `input_positions[k]` is the position (among the graph module's example inputs) of the
    tensor feeding ONNX input `input_names[k]`; `frozen` inputs are ONNX initializers;
    `derived` SymInt inputs are read from tensor shapes inside the model; `scalars` are
    module floats dynamo passed as 0-d tensors, inlined as numbers. `carriers` are symbolic
    int inputs no tensor size carries, fed as ONNX inputs `carrier_names` of shape (n, 0)
    (`onnx_prepare.size_carrier`: the runner makes one per call from the int). `fixed` are
    plain int inputs of a graph specialized for one shape, inlined: a runner refuses a call
    that passes another value (`check_fixed`). `mutated` inputs are
    written in place by the graph: their new values are the model's last outputs, in that
    order, for the caller to copy back (ONNX has no in-place writes). `warnings`: what
    the exporter warned, one line each, kept for the report (not part of an artefact).
    """

    model: bytes
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    input_positions: tuple[int, ...]
    frozen: tuple[int, ...]
    derived: tuple[int, ...]
    scalars: Mapping[int, float]
    dynamic_dims: Mapping[int, tuple[int, ...]]
    opset: int
    num_initializers: int
    decomposed: tuple[str, ...] = ()
    mutated: tuple[int, ...] = ()
    warnings: tuple[str, ...] = ()  # raised while exporting (quiet()): the report keeps them
    carriers: tuple[int, ...] = ()  # int input positions fed as size carriers ...
    carrier_names: tuple[str, ...] = ()  # ... as these ONNX inputs (after `input_names`)
    fixed: Mapping[int, int] = dataclasses.field(default_factory=dict)  # plain ints inlined
    # the intra-op thread count timed fastest for this export on CPU (1; 0: ORT's default;
    # None: not timed), stored with it: a warm start on the same machine reuses it
    threads: int | None = None

    @classmethod
    def of_model(
        cls, model: bytes, input_names: Sequence[str], output_names: Sequence[str], opset: int
    ) -> OnnxGraph:
        """A saved model's graph: inputs fed in order, nothing frozen, derived or written."""
        return cls(
            model=model,
            input_names=tuple(input_names),
            output_names=tuple(output_names),
            input_positions=tuple(range(len(input_names))),
            frozen=(),
            derived=(),
            scalars={},
            dynamic_dims={},
            opset=opset,
            num_initializers=0,
        )

    @property
    def num_outputs(self) -> int:
        """The graph's own outputs (without the new values of mutated inputs)."""
        return len(self.output_names) - len(self.mutated)


def exporter_line(error: BaseException) -> str:
    """The exporter's own reason in one line: its exception summary, without the boilerplate."""
    text = str(error)
    match = re.search(r"## Exception summary\s*\n+(.+)", text)
    line = match.group(1) if match else next((s for s in text.splitlines() if s.strip()), "")
    line = re.sub(r"\x1b\[[0-9;]*m", "", line)
    line = re.sub(r"<class '(?:[\w.]+\.)?(\w+)'>", r"\1", line).strip()
    line = re.sub(r"<OpOverload\(op='([\w.]+)', overload='(\w+)'\)>", r"\1.\2", line)
    return one_line(error, message=line)


_REGISTRIES: dict[int, Any] = {}
_REGISTRY_LOCK = threading.Lock()


def _capture(module: torch.nn.Module, args: tuple[torch.Tensor, ...], dynamic_shapes: Any) -> Any:
    """The graph as an ExportedProgram, traced non-strict and nothing else.

    Handed a module, the ONNX exporter falls back to strict `torch.export`, which re-enters
    dynamo: inside a backend dynamo holds its compile lock, so the fallback deadlocks (it
    ends in `torch._dynamo.reset()`), or, once a timed-out worker is abandoned, wipes every
    compiled frame of the process. Handed a program, it only translates it.
    """
    try:
        with cancel.process_wide():  # torch.export patches torch for every thread meanwhile
            return torch.export.export(module, args, dynamic_shapes=dynamic_shapes, strict=False)
    except cancel.Cancelled:
        raise
    except Exception as error:
        line = f"torch.export (non-strict): {exporter_line(error)}"
        if dynamic_shapes is not None:  # most such failures are the symbolic dims asked for
            line = f"dynamic shapes: {line}"
        raise Unsupported(line, detail=str(error)) from error


def _torch_onnx_export(
    module: torch.nn.Module, args: tuple[torch.Tensor, ...], dynamic_shapes: Any, opset: int | None
) -> Any:
    """`torch.onnx.export(..., dynamo=True)` of the non-strict capture, reusing its op
    registry between graphs.

    The public entry rebuilds the aten -> ONNX registry on every call (about 3 s of the
    4.5 s a small graph takes: it re-parses ~500 onnxscript functions). When the
    exporter's internals are where torch 2.13 has them, we build it once per opset and
    call the exporter core with it; otherwise we take the public entry.
    """
    program = _capture(module, args, dynamic_shapes)
    try:
        from torch.onnx import _constants as onnx_constants
        from torch.onnx._internal.exporter import _constants, _core, _registration
    except ImportError:
        _core = None
    same = {"optimize": True, "verbose": False, "report": False}  # both entries take these
    if _core is None or not hasattr(_registration.ONNXRegistry, "from_torchlib"):
        with cancel.process_wide():
            return torch.onnx.export(
                program, (), dynamo=True, opset_version=opset, external_data=False, **same
            )
    filter_noisy_loggers()  # the exporter's modules are imported now
    opset = opset or onnx_constants.ONNX_DEFAULT_OPSET
    registry_opset = max(opset, _constants.TORCHLIB_OPSET)
    with _REGISTRY_LOCK:
        if registry_opset not in _REGISTRIES:
            _REGISTRIES[registry_opset] = _registration.ONNXRegistry.from_torchlib(
                opset_version=registry_opset
            )
    with cancel.process_wide():  # decompositions run make_fx, process-wide too
        return _core.export(
            program, (), {}, registry=_REGISTRIES[registry_opset], opset_version=opset, **same
        )


def _in_clean_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call `fn` on a fresh thread: none of dynamo's thread-local state (tracing context,
    fake mode, shape env, eval-frame hook) leaks into a nested torch.export, and the
    nested export leaves no guards behind in the frame dynamo is compiling.

    The thread runs in the caller's grad and inference mode (a new thread starts with
    gradients on: a graph captured under no_grad, traced again with gradients, can take
    other kernels and layouts), and keeps the caller's cancellation token
    (`backends.cancel`) and its quiet() (warnings go to the caller's list). torch.export
    itself runs one at a time
    (`cancel.process_wide`): it patches torch for every thread while it traces.
    """
    loud = not quiet_here()
    captured = captured_here()
    grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()

    def run() -> T:
        with (
            torch.inference_mode(inference),
            torch.set_grad_enabled(grad),
            contextlib.nullcontext() if loud else quiet(captured),
        ):
            return fn(*args, **kwargs)

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="onnx-export") as pool:
        return pool.submit(cancel.carried(run)).result()


def export_onnx(
    gm: fx.GraphModule,
    example_inputs: Sequence[object],
    *,
    dynamic_dims: Mapping[int, Sequence[int]] | None = None,
    freeze: Sequence[int] | None = None,
    opset: int | None = None,
    carry_ints: bool = False,
    fix_ints: bool = False,
) -> OnnxGraph:
    """Export `gm` to ONNX with its parameters and buffers as initializers.

    `freeze`: input positions to bake in as constants (default: the inputs dynamo took from
    module parameters/buffers). `dynamic_dims`: position -> dims exported as symbolic
    (default: the dims dynamo marked dynamic). `carry_ints`: symbolic ints no tensor size
    carries become ONNX inputs of their own (`OnnxGraph.carriers`), which the caller feeds;
    else they are refused. `fix_ints`: plain int inputs (a graph specialized for one shape)
    are inlined (`OnnxGraph.fixed`); else they are refused. Raises Unsupported with the
    exporter's reason.
    """
    if freeze is None:
        frozen, scalars = weight_inputs(gm, example_inputs), module_scalars(gm, example_inputs)
    else:
        frozen, scalars = tuple(freeze), {}
    dims = symbolic_dims(gm, example_inputs) if dynamic_dims is None else dynamic_dims
    caught: list[str] = []  # the exporter's warnings, for the report instead of stderr
    ints = (carry_ints, fix_ints)
    prepared, program, dims = _export(
        gm, example_inputs, frozen, scalars, dims, opset, (), caught, ints
    )
    mutated = _mutated_inputs(program, prepared)
    if mutated:  # again, unfrozen and returned: ONNX drops in-place writes to inputs
        unfrozen = tuple(i for i in frozen if i not in mutated)
        prepared, program, dims = _export(
            gm, example_inputs, unfrozen, scalars, dims, opset, mutated, caught, ints
        )
        missed = set(_mutated_inputs(program, prepared)) - set(mutated)
        if missed:
            raise Unsupported(f"graph writes to inputs {sorted(missed)} the export cannot return")
    check_dynamic(program.model_proto, prepared.fed, dims)
    graph = _describe(program.model_proto, prepared, dims, mutated)
    return dataclasses.replace(graph, warnings=tuple(dict.fromkeys(caught)))


def _export(
    gm: fx.GraphModule,
    example_inputs: Sequence[object],
    frozen: Sequence[int],
    scalars: Mapping[int, float],
    dynamic_dims: Mapping[int, Sequence[int]],
    opset: int | None,
    mutated: Sequence[int],
    caught: list[str],
    ints: tuple[bool, bool] = (False, False),
) -> tuple[PreparedGraph, Any, dict[int, tuple[int, ...]]]:
    """Prepare the graph and run the exporter on it; its failures become Unsupported, its
    warnings go to `caught`. `ints`: prepare_graph's (carry_ints, fix_ints)."""
    carry, fix = ints
    prepared = prepare_graph(
        gm, example_inputs, frozen, scalars, returns=mutated, carry_ints=carry, fix_ints=fix
    )
    dims = {i: tuple(d) for i, d in dynamic_dims.items() if i in prepared.kept and d}
    dims.update({i: (0,) for i in prepared.carriers})  # a carrier's dim 0 is its int
    args = tuple(_real(example_inputs[i]) for i in prepared.kept) + tuple(
        size_carrier(_hint(example_inputs[i])) for i in prepared.carriers
    )
    dynamic_shapes = None
    if dims:
        dynamic_shapes = tuple(
            {d: torch.export.Dim.DYNAMIC for d in dims.get(i, ())} or None for i in prepared.fed
        )
    with quiet(into=caught):
        try:
            program = _in_clean_thread(
                _torch_onnx_export, prepared.module.eval(), args, dynamic_shapes, opset
            )
        except torch.onnx.OnnxExporterError as error:
            reason = exporter_line(error)
            if dims:
                reason = f"dynamic shapes: {reason} (symbolic dims {dict(dims)})"
            raise Unsupported(reason, detail=str(error)) from error
    if program is None:
        raise Unsupported("torch.onnx.export returned no program")
    return prepared, program, dims


def _mutated_inputs(program: Any, prepared: PreparedGraph) -> tuple[int, ...]:
    """Original input positions the graph writes in place, from torch.export's signature.

    User inputs are the fed positions in order (kept tensors, then size carriers); a frozen
    weight is the buffer `_frozen_<position>` (a graph that writes to a module buffer).
    """
    exported = getattr(program, "exported_program", None)
    if exported is None:
        return ()
    signature = exported.graph_signature
    user = {name: prepared.fed[k] for k, name in enumerate(signature.user_inputs)}
    found = {user[name] for name in signature.user_inputs_to_mutate.values() if name in user}
    for target in signature.buffers_to_mutate.values():
        match = re.fullmatch(r"_frozen_(\d+)", target)
        if match is None:
            raise Unsupported(f"graph writes to buffer {target!r}, which is not an input")
        found.add(int(match.group(1)))
    return tuple(sorted(found))


def check_dynamic(
    proto: onnx.ModelProto, kept: Sequence[int], dims: Mapping[int, Sequence[int]]
) -> None:
    """Decline a model whose symbolic dims the exporter specialized to numbers."""
    if not dims:
        return
    initializers = {t.name for t in proto.graph.initializer}
    inputs = [i for i in proto.graph.input if i.name not in initializers]
    for value, position in zip(inputs, kept, strict=False):
        shape = value.type.tensor_type.shape.dim
        for d in dims.get(position, ()):
            if d < len(shape) and not shape[d].dim_param:
                raise Unsupported(
                    f"dynamic shapes: the exporter fixed dim {d} of input {position} "
                    f"to {shape[d].dim_value}"
                )


def _real(value: object) -> torch.Tensor:
    """A real tensor to trace with (dynamo's example inputs are real; guard against fakes)."""
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(value, FakeTensor) or not isinstance(value, torch.Tensor):
        raise Unsupported("example inputs are fake tensors: export needs real ones")
    return value.detach()


def _hint(value: object) -> int:
    """The value of a symbolic int input now (dynamo's hint: this call's size), as a number."""
    if isinstance(value, torch.SymInt):
        if not value.node.has_hint():
            raise Unsupported(f"symbolic int input {value} is data-dependent: no value to trace")
        return int(value.node.hint)
    return int(value)  # type: ignore[call-overload]


def _describe(
    proto: onnx.ModelProto,
    prepared: PreparedGraph,
    dims: Mapping[int, tuple[int, ...]],
    mutated: tuple[int, ...],
) -> OnnxGraph:
    """Serialize the proto and pair its inputs with the original input positions."""
    graph = proto.graph
    initializers = {t.name for t in graph.initializer}
    inputs = tuple(i.name for i in graph.input if i.name not in initializers)
    kept = prepared.kept
    if len(inputs) != len(prepared.fed):
        raise Unsupported(
            f"exported model has {len(inputs)} inputs, the graph feeds {len(prepared.fed)} tensors"
        )
    try:
        data = proto.SerializeToString()
    except ValueError as error:  # protobuf's 2 GB limit
        raise Unsupported(f"ONNX model cannot be serialized: {error}") from error
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    return OnnxGraph(
        model=data,
        input_names=inputs[: len(kept)],
        output_names=tuple(o.name for o in graph.output),
        input_positions=kept,
        frozen=prepared.frozen,
        derived=prepared.derived,
        scalars=dict(prepared.scalars),
        dynamic_dims=dict(dims),
        opset=int(opset),
        num_initializers=len(graph.initializer),
        decomposed=prepared.decomposed,
        mutated=mutated,
        carriers=prepared.carriers,
        carrier_names=inputs[len(kept) :],
        fixed=dict(prepared.fixed),
    )
