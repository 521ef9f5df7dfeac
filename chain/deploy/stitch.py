"""Replace compiled submodule calls of a graph module by `run_payload` op calls.

The result is a new graph module (the given one is not touched): every other node is
copied, parameters and buffers keep their kind and name, each payload is a plain uint8
tensor attribute (which torch.export lifts as a constant), and PyTorch submodules stay
calls that the final torch.export traces through (inlines).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx

import chain.deploy.ops  # noqa: F401  (registers backend_chain::run_payload)
from backends.common.fx_utils import fetch_attr
from backends.common.parts import Part
from backends.common.payload import TensorSpec, digest, specs_to_str, to_tensor

PAYLOAD_PREFIX = "_chain_payload_"


def _assign(root: torch.nn.Module, target: str, value: Any, buffers: set[str]) -> None:
    """Set `target` (dotted) on `root`, creating submodules, keeping parameters and buffers."""
    *path, leaf = target.split(".")
    module = root
    for part in path:
        child = getattr(module, part, None)
        if child is None:
            child = torch.nn.Module()
            module.add_module(part, child)
        module = child
    if isinstance(value, torch.nn.Module):
        module.add_module(leaf, value)
    elif isinstance(value, torch.nn.Parameter):
        module.register_parameter(leaf, value)
    elif target in buffers:
        module.register_buffer(leaf, value)
    else:
        setattr(module, leaf, value)


def stitch(gm: fx.GraphModule, parts: dict[str, Part]) -> fx.GraphModule:
    """A copy of `gm` where the calls of `parts` (submodule names) run their payloads."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    root = torch.nn.Module()
    buffers = {name for name, _ in gm.named_buffers()}
    for node in gm.graph.nodes:
        part = parts.get(str(node.target)) if node.op == "call_module" else None
        if part is not None:
            env[node] = _op_call(graph, root, node, part, env)
            continue
        if node.op == "output":
            graph.output(fx.map_arg(node.args[0], lambda n: env[n]))
            continue
        env[node] = graph.node_copy(node, lambda n: env[n])
        if node.op in ("get_attr", "call_module") and not hasattr(root, str(node.target)):
            _assign(root, str(node.target), fetch_attr(gm, str(node.target)), buffers)
    graph.lint()
    stitched = fx.GraphModule(root, graph)
    _unbuffer(stitched, root, buffers)
    return stitched


def _unbuffer(stitched: fx.GraphModule, root: torch.nn.Module, buffers: set[str]) -> None:
    """fx registers every copied tensor as a buffer; constants (payloads) become plain again."""
    for node in stitched.graph.nodes:
        target = str(node.target)
        if node.op != "get_attr" or target in buffers:
            continue
        value = fetch_attr(root, target)
        if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
            *path, leaf = target.split(".")
            owner = stitched.get_submodule(".".join(path)) if path else stitched
            owner._buffers.pop(leaf, None)
            setattr(owner, leaf, value)


def _op_call(
    graph: fx.Graph,
    root: torch.nn.Module,
    node: fx.Node,
    part: Part,
    env: dict[fx.Node, fx.Node],
) -> fx.Node:
    """Payload constant + `run_payload` call; a single-output part is unwrapped by getitem."""
    name = f"{PAYLOAD_PREFIX}{part.name.removeprefix('_')}"
    packed = part.payload
    setattr(root, name, to_tensor(packed))
    args = [fx.map_arg(a, lambda n: env[n]) for a in node.args]
    payload = graph.get_attr(name)
    specs: list[TensorSpec] = list(part.header.outputs)
    bound = specs_to_str(specs, part.name, digest(packed), part.program)
    call = graph.call_function(
        torch.ops.backend_chain.run_payload.default,
        ([args[i] for i in part.input_positions], payload, bound),
    )
    if part.returns_tuple:
        return call  # the partitioner already reads each output with getitem
    return graph.call_function(operator.getitem, (call, 0))
