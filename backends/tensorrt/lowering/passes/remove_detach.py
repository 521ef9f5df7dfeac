"""Remove `aten.detach`: an inference graph has no autograd to cut, so it is an identity."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import fx

from backends.tensorrt.lowering.registry import aten, finish, is_op, replace_node


def remove_detach(gm: fx.GraphModule, sample_inputs: Sequence[Any]) -> fx.GraphModule:
    """Replace every `detach` / `detach_` node by its input."""
    changes = []
    for node in list(gm.graph.nodes):
        if is_op(node, aten.detach, aten.detach_):
            replace_node(node, node.args[0])
            changes.append(f"removed {node.name}")
    return finish(gm, "remove_detach", changes)
