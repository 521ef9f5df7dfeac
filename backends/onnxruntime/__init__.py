"""onnxruntime: FX graph -> ONNX (weights as initializers) -> ONNX Runtime, zero-copy I/O.

Export and session creation happen once per graph, at compile time; `chain.export` puts
the ONNX models in programs through the hooks of `deploy.py`. The compiled callable
carries the ONNX bytes as `chain_payload` and providers, opset, initializer count and
frozen inputs as `chain_details`. See `runtime` for what happens when frozen weights change.

Options: `providers` (default: TensorRT EP and CUDA EP for CUDA inputs when installed, then
CPU), `graph_optimization_level` (disable|basic|extended|all, default all),
`intra_op_num_threads` (default: ORT's), `allow_spinning` (default False: see
`common.ort_session.session_options`), `on_weight_change` (reexport|raise, default
reexport).
Inputs the graph writes in place come back as extra ONNX outputs and are copied into the
caller's tensors. Refused with `Unsupported`: autograd graphs (inputs that require grad
under grad mode), non-tensor inputs/outputs, inputs on several devices, ops the exporter
or ORT cannot take, dynamic shapes the exporter cannot express ("dynamic shapes: ...").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx
from torch.fx.experimental.symbolic_shapes import statically_known_true as known

from backends import cancel
from backends.common.fx_utils import refuse_training
from backends.common.onnx_export import OnnxGraph, export_onnx
from backends.common.ort_session import LEVELS, session_options
from backends.errors import Unsupported
from backends.onnxruntime.artefact import from_artefact
from backends.onnxruntime.deploy import export_parts, load_payload
from backends.onnxruntime.runtime import (
    Compiled,
    FrozenWeightChanged,
    OrtRunner,
    OutputSpec,
    snapshot_frozen,
)
from backends.onnxruntime.session import (
    Provider,
    available,
    create_session,
    default_providers,
    provider_names,
    user_stream,
)
from backends.options import BadValue, Check, boolean, one_of, optional, threads
from backends.registry import register_backend


def _providers(value: Any) -> Any:
    """A list of provider names or (name, options) pairs, as `InferenceSession` takes them."""
    ok = isinstance(value, list | tuple) and all(
        isinstance(p, str)
        or (isinstance(p, tuple | list) and len(p) == 2 and isinstance(p[0], str))
        for p in value
    )
    if not ok:
        raise BadValue("a list of provider names or (name, options) pairs")
    return value


OPTIONS: dict[str, Check] = {  # name -> value check (backends.options), checked at chain()
    "providers": optional(_providers),
    "graph_optimization_level": one_of(*LEVELS),
    "intra_op_num_threads": optional(threads()),
    "allow_spinning": boolean,
    "on_weight_change": one_of("reexport", "raise"),
}


def _device_of(example_inputs: Sequence[object]) -> torch.device:
    """The one device every tensor input lives on (cpu for a graph without tensors)."""
    devices = {t.device for t in example_inputs if isinstance(t, torch.Tensor)}
    if len(devices) > 1:
        raise Unsupported(f"inputs on several devices: {sorted(map(str, devices))}")
    return devices.pop() if devices else torch.device("cpu")


def _output_nodes(gm: fx.GraphModule) -> tuple[list[object], bool]:
    """The graph's outputs, flat, and whether it returns one bare value (not a tuple)."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0]
    if isinstance(out, tuple | list):
        return list(out), False
    return [out], True


def _nhwc(value: torch.Tensor) -> bool:
    """Whether an example output is channels_last (and not also contiguous), asked without
    guards (`statically_known_true`: a symbolic size must not gain a guard): unknown is False."""
    if value.dim() != 4:
        return False
    (_, c, h, w), (sn, sc, sh, sw) = value.shape, value.stride()
    nhwc = all(map(known, (sc == 1, sw == c, sh == w * c, sn == h * w * c)))
    return nhwc and not all(map(known, (sw == 1, sh == w, sc == h * w)))


def _output_specs(outputs: Sequence[object]) -> list[OutputSpec]:
    """Shape/dtype of each output from the graph's example values; raise on non-tensors."""
    specs = []
    for k, node in enumerate(outputs):
        if isinstance(node, fx.Node):
            value = node.meta.get("example_value", node.meta.get("val"))
            if value is None:  # a graph traced without values: ORT allocates the output
                specs.append(OutputSpec(None, None))
                continue
        else:
            value = node
        if not isinstance(value, torch.Tensor):
            raise Unsupported(f"graph output {k} is a {type(value).__name__}, not a tensor")
        static = all(isinstance(s, int) for s in value.shape)
        specs.append(OutputSpec(tuple(value.shape) if static else None, value.dtype, _nhwc(value)))
    return specs


def check_inference(example_inputs: Sequence[object]) -> None:
    """Refuse autograd graphs: ORT computes no gradients, so outputs would lose grad_fn."""
    refuse_training(example_inputs, "ONNX Runtime computes no gradients")


def details(graph: OnnxGraph, providers: Sequence[Provider], session: Any) -> dict[str, Any]:
    """JSON-able facts for the chain's report."""
    return {
        "providers": session.get_providers(),
        "requested_providers": provider_names(providers),
        "opset": graph.opset,
        "initializers": graph.num_initializers,
        "frozen_inputs": list(graph.frozen),
        "graph_inputs": list(graph.input_names),
        "derived_symints": list(graph.derived),
        "dynamic_dims": {str(k): list(v) for k, v in graph.dynamic_dims.items()},
        "decomposed": list(graph.decomposed),
        "mutated_inputs": list(graph.mutated),
        "model_bytes": len(graph.model),
        **({"warnings": list(graph.warnings)} if graph.warnings else {}),  # kept off stderr
    }


def _compile(
    gm: fx.GraphModule,
    example_inputs: list[Any],
    stored: OnnxGraph | None,
    *,
    providers: Sequence[Provider] | None = None,
    graph_optimization_level: str = "all",
    intra_op_num_threads: int | None = None,
    allow_spinning: bool = False,
    on_weight_change: str = "reexport",
) -> OrtRunner:
    """The runner for `gm`: from the `stored` export when given (no export), else exported."""
    options = session_options(graph_optimization_level, intra_op_num_threads, allow_spinning)
    check_inference(example_inputs)
    device = _device_of(example_inputs)
    outputs, single = _output_nodes(gm)
    specs = _output_specs(outputs)
    chosen = list(providers) if providers is not None else default_providers(device)

    def build(inputs: Sequence[object], graph: OnnxGraph | None = None) -> Compiled:
        graph = graph if graph is not None else export_onnx(gm, inputs)
        if graph.num_outputs != len(specs):
            raise Unsupported(
                f"exported model has {graph.num_outputs} outputs, graph has {len(specs)}"
            )
        if any(i >= len(inputs) for i in (*graph.input_positions, *graph.frozen)):
            raise Unsupported(f"the model reads inputs the graph has not ({len(inputs)} inputs)")
        cancel.checkpoint()  # an abandoned compile builds no session
        session = create_session(graph.model, options, chosen)
        return Compiled(graph, session, snapshot_frozen(graph, inputs))

    compiled = build(example_inputs, stored)
    facts = details(compiled.graph, chosen, compiled.session)
    if stored is not None:
        facts["from_artefact"] = True  # built from a stored export: nothing exported
    return OrtRunner(
        compiled,
        device=device,
        outputs=specs,
        single_output=single,
        rebuild=build,
        on_weight_change=on_weight_change,
        details=facts,
        stream=user_stream(chosen),
    )


def onnxruntime_reuse(
    gm: fx.GraphModule, example_inputs: list[Any], *, artefact: bytes, **options: Any
) -> OrtRunner:
    """The backend's compile from a stored export (`chain_artefact`): no export, a session."""
    return _compile(gm, example_inputs, from_artefact(artefact), **options)


@register_backend(
    "onnxruntime",
    available=available,
    options=OPTIONS,
    exporter=export_parts,
    loader=load_payload,
    reuse=onnxruntime_reuse,
)
def onnxruntime_backend(gm: fx.GraphModule, example_inputs: list[Any], **options: Any) -> OrtRunner:
    """Export the graph to ONNX once and run it with ONNX Runtime."""
    return _compile(gm, example_inputs, None, **options)


__all__ = [
    "OPTIONS",
    "FrozenWeightChanged",
    "OnnxGraph",
    "OrtRunner",
    "export_onnx",
    "onnxruntime_backend",
]

from backends.onnxruntime import graphs as _graphs  # noqa: E402, F401  (its CUDA graphs variant)
