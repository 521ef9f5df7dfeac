"""Compiled parts from what the chain's winner built: TensorRT engines, a whole ORT model.

No recompiling: the payloads are the engines and the ONNX model the chain verified.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from chain.deploy.payload import Header, OutputSpec, digest
from chain.deploy.stitch import CompiledPart, output_specs, record_calls

WHOLE = "_run_on_acc_whole"


def tensorrt_parts(compiled: Any, flat_inputs: Sequence[Any]) -> tuple[fx.GraphModule, dict]:
    """The tensorrt backend's stitched graph and a payload per engine module in it."""
    from backends.tensorrt.conversion.engine import tensorrt_version
    from backends.tensorrt.runtime.engine_module import TensorRTEngineModule

    gm: fx.GraphModule = compiled.gm
    engines = {
        str(n.target): gm.get_submodule(str(n.target))
        for n in gm.graph.nodes
        if n.op == "call_module"
        and isinstance(gm.get_submodule(str(n.target)), TensorRTEngineModule)
    }
    calls = record_calls(gm, flat_inputs, set(engines))
    version = tensorrt_version()
    parts: dict[str, CompiledPart] = {}
    for name, module in engines.items():
        args, out = calls[name]
        outputs, _ = output_specs(out)
        device = args[0].device if args else torch.device("cuda")
        index = device.index or 0
        major, minor = torch.cuda.get_device_capability(index)
        header = Header(
            backend="tensorrt",
            version=version,
            sha256=digest(module.serialized),
            input_names=module.input_names,
            output_names=module.output_names,
            outputs=tuple(OutputSpec.of(t) for t in outputs),
            device="cuda",
            gpu=torch.cuda.get_device_name(index),
            compute_capability=f"{major}.{minor}",
        )
        parts[name] = CompiledPart(
            name=name,
            header=header,
            body=module.serialized,
            input_positions=tuple(range(len(args))),
            returns_tuple=module.returns_tuple,
        )
    return gm, parts


def as_single_call(gm: fx.GraphModule) -> fx.GraphModule:
    """A graph module whose one node calls `gm` whole (so `stitch` can replace that call)."""
    graph = fx.Graph()
    root = torch.nn.Module()
    root.add_module(WHOLE, gm)
    inputs = [graph.placeholder(n.name) for n in gm.graph.nodes if n.op == "placeholder"]
    call = graph.call_module(WHOLE, tuple(inputs))
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0]
    outs = [graph.call_function(operator.getitem, (call, i)) for i in range(len(output))]
    graph.output(tuple(outs))
    return fx.GraphModule(root, graph)


def onnxruntime_whole(
    gm: fx.GraphModule, runner: Any, flat_inputs: Sequence[Any]
) -> tuple[fx.GraphModule, dict] | None:
    """The ORT backend's whole-graph model as one part; None when it froze or derived inputs."""
    graph = getattr(runner, "graph", None)
    if graph is None or graph.frozen or graph.derived or graph.scalars:
        return None
    with torch.no_grad():
        outputs, _ = output_specs(gm(*flat_inputs))
    device = next((t.device for t in flat_inputs if isinstance(t, torch.Tensor)), None)
    header = Header.for_onnx(graph, outputs, device.type if device is not None else "cpu")
    part = CompiledPart(
        name=WHOLE,
        header=header,
        body=graph.model,
        input_positions=graph.input_positions,
        returns_tuple=True,
        ops=sum(1 for n in gm.graph.nodes if n.op == "call_function"),
    )
    return as_single_call(gm), {WHOLE: part}
