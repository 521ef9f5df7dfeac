"""Freeze parameters and fold constant subgraphs into `get_attr` constants.

Dynamo hands parameters and buffers over as inputs; the ATen step tags their placeholders
with `node.meta[FREEZE]`. This pass turns each tagged input into a `get_attr` constant (the
placeholder stays, unused, so the calling convention is unchanged), then evaluates every
node whose inputs are all constants (weight transposes, batch-norm statistics, casts) once,
so TensorRT sees weights, not weight arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from backends.common.fx_utils import fetch_attr
from backends.tensorrt.aten import FREEZE
from backends.tensorrt.lowering.registry import finish, replace_node

# Folding these would materialise large tensors from small ones, or change randomness.
_NO_FOLD = {"expand", "repeat", "full", "zeros", "ones", "empty", "arange", "new_full"}
_MAX_GROWTH = 4


def constant_fold(gm: fx.GraphModule, sample_inputs: Sequence[Any]) -> fx.GraphModule:
    """Freeze tagged placeholders into constants, then fold all-constant nodes."""
    changes = _freeze(gm, sample_inputs)
    constants = {n: fetch_attr(gm, str(n.target)) for n in gm.graph.nodes if n.op == "get_attr"}
    constants = {n: v for n, v in constants.items() if isinstance(v, torch.Tensor)}
    for node in list(gm.graph.nodes):
        if not _foldable(node, constants):
            continue
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: constants[n])
        value = node.target(*args, **kwargs)
        if not isinstance(value, torch.Tensor) or not _small_enough(value, node, constants):
            continue
        name = _register(gm, f"_frozen_{node.name}", value)
        with gm.graph.inserting_before(node):
            const = gm.graph.get_attr(name)
        const.meta.update(node.meta)
        constants[const] = value
        replace_node(node, const)
        changes.append(f"folded {node.name}")
    return finish(gm, "constant_fold", changes)


def _freeze(gm: fx.GraphModule, sample_inputs: Sequence[Any]) -> list[str]:
    changes = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, value in zip(placeholders, sample_inputs, strict=False):
        if not node.meta.get(FREEZE) or not isinstance(value, torch.Tensor) or not node.users:
            continue
        name = _register(gm, f"_frozen_{node.name}", value.detach())
        with gm.graph.inserting_after(placeholders[-1]):
            const = gm.graph.get_attr(name)
        const.meta.update(node.meta)
        const.meta.pop(FREEZE, None)
        node.replace_all_uses_with(const)
        changes.append(f"froze input {node.name}")
    return changes


def _foldable(node: fx.Node, constants: dict[fx.Node, torch.Tensor]) -> bool:
    if node.op != "call_function" or not node.all_input_nodes or node.is_impure():
        return False
    if not all(n in constants for n in node.all_input_nodes):
        return False
    schema_name = getattr(getattr(node.target, "overloadpacket", None), "__name__", "")
    return schema_name not in _NO_FOLD


def _small_enough(value: torch.Tensor, node: fx.Node, constants: dict[fx.Node, Any]) -> bool:
    largest = max(constants[n].numel() for n in node.all_input_nodes)
    return value.numel() <= _MAX_GROWTH * max(largest, 1)


def _register(gm: fx.GraphModule, base: str, value: torch.Tensor) -> str:
    name, i = base, 0
    while hasattr(gm, name):
        i += 1
        name = f"{base}_{i}"
    gm.register_buffer(name, value, persistent=False)
    return name
