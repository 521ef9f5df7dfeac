"""What both ONNX Runtime runners read of a graph (the plain one and its CUDA graphs variant):
the device of its inputs, its outputs and their specs, whether it is an inference graph, and
the facts the report shows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx
from torch.fx.experimental.symbolic_shapes import statically_known_true as known

from backends.common.fx_utils import refuse_training
from backends.common.onnx_export import OnnxGraph
from backends.errors import Unsupported
from backends.onnxruntime.runtime import OutputSpec
from backends.onnxruntime.session import Provider, provider_names


def device_of(example_inputs: Sequence[object]) -> torch.device:
    """The one device every tensor input lives on (cpu for a graph without tensors)."""
    devices = {t.device for t in example_inputs if isinstance(t, torch.Tensor)}
    if len(devices) > 1:
        raise Unsupported(f"inputs on several devices: {sorted(map(str, devices))}")
    return devices.pop() if devices else torch.device("cpu")


def output_nodes(gm: fx.GraphModule) -> tuple[list[object], bool]:
    """The graph's outputs, flat, and whether it returns one bare value (not a tuple)."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0]
    if isinstance(out, tuple | list):
        return list(out), False
    return [out], True


def nhwc(value: torch.Tensor) -> bool:
    """Whether an example output is channels_last (and not also contiguous), asked without
    guards (`statically_known_true`: a symbolic size must not gain a guard): unknown is False."""
    if value.dim() != 4:
        return False
    (_, c, h, w), (sn, sc, sh, sw) = value.shape, value.stride()
    nhwc = all(map(known, (sc == 1, sw == c, sh == w * c, sn == h * w * c)))
    return nhwc and not all(map(known, (sw == 1, sh == w, sc == h * w)))


def output_specs(outputs: Sequence[object]) -> list[OutputSpec]:
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
        specs.append(OutputSpec(tuple(value.shape) if static else None, value.dtype, nhwc(value)))
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
        **({"size_carriers": list(graph.carriers)} if graph.carriers else {}),
        **({"fixed_ints": {str(k): v for k, v in graph.fixed.items()}} if graph.fixed else {}),
        "dynamic_dims": {str(k): list(v) for k, v in graph.dynamic_dims.items()},
        "decomposed": list(graph.decomposed),
        "mutated_inputs": list(graph.mutated),
        "model_bytes": len(graph.model),
        **({"warnings": list(graph.warnings)} if graph.warnings else {}),  # kept off stderr
    }
