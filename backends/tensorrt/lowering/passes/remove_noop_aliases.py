"""Remove clones and aliases that copy nothing observable in a functional inference graph.

A clone that asks for a memory format is kept (the PyTorch parts may rely on the layout);
so is a clone whose input is a placeholder and which feeds the output (see
`repair_input_as_output`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from backends.tensorrt.lowering.registry import aten, finish, is_op, replace_node


def remove_noop_aliases(gm: fx.GraphModule, sample_inputs: Sequence[Any]) -> fx.GraphModule:
    """Replace `clone` (without a memory format) and `alias` nodes by their input."""
    changes = []
    for node in list(gm.graph.nodes):
        if not is_op(node, aten.clone, aten.alias):
            continue
        source = node.args[0]
        memory_format = node.kwargs.get("memory_format")
        if memory_format not in (None, torch.preserve_format):
            continue
        if isinstance(source, fx.Node) and source.op == "placeholder" and _is_returned(node):
            continue
        replace_node(node, source)
        changes.append(f"removed {node.name}")
    return finish(gm, "remove_noop_aliases", changes)


def _is_returned(node: fx.Node) -> bool:
    return any(user.op == "output" for user in node.users)
