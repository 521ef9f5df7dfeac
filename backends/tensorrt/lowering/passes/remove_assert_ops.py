"""Remove runtime assertion nodes (shape/value checks from tracing): nothing to convert."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from backends.tensorrt.lowering.registry import finish

ASSERT_TARGETS: frozenset[Any] = frozenset(
    op
    for name in (
        "_assert_async",
        "_assert_scalar",
        "_assert_tensor_metadata",
        "sym_constrain_range",
        "sym_constrain_range_for_size",
        "_functional_assert_async",
        "_functional_assert_scalar",
    )
    if (packet := getattr(torch.ops.aten, name, None)) is not None
    for op in (packet, *(getattr(packet, o) for o in packet.overloads()))
) | {torch._assert}


def remove_assert_ops(gm: fx.GraphModule, sample_inputs: Sequence[Any]) -> fx.GraphModule:
    """Erase assertion nodes; their (dependency-token) results must be unused or dead."""
    changes = []
    for node in reversed(list(gm.graph.nodes)):
        if node.op == "call_function" and node.target in ASSERT_TARGETS:
            if any(user.target not in ASSERT_TARGETS for user in node.users):
                continue
            for user in list(node.users):
                gm.graph.erase_node(user)
            gm.graph.erase_node(node)
            changes.append(f"removed {node.name}")
    return finish(gm, "remove_assert_ops", changes)
