"""Remove `_to_copy` / `to` nodes that keep dtype, device and layout: a copy for nothing.

Such copies split TensorRT blocks (they are cast layers at best) and come from
`.to(x.dtype)` / `.float()` calls on tensors already of that type.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import fx

from backends.tensorrt.lowering.registry import aten, finish, is_op, replace_node

_KEYS = ("dtype", "device", "layout")


def remove_noop_to_copy(gm: fx.GraphModule, sample_inputs: Sequence[Any]) -> fx.GraphModule:
    """Replace a `_to_copy` whose input already has the requested dtype/device/layout."""
    changes = []
    for node in list(gm.graph.nodes):
        if not is_op(node, aten._to_copy.default) or len(node.args) != 1:
            continue
        source = node.args[0]
        before = source.meta.get("val") if isinstance(source, fx.Node) else None
        after = node.meta.get("val")
        if before is None or after is None:
            continue
        if set(node.kwargs) - {*_KEYS, "memory_format", "non_blocking"}:
            continue
        if all(getattr(before, k) == getattr(after, k) for k in _KEYS):
            replace_node(node, source)
            changes.append(f"removed {node.name} ({after.dtype}, {after.device})")
    return finish(gm, "remove_noop_to_copy", changes)
