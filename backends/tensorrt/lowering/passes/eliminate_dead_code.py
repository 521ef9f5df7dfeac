"""Drop nodes whose results nobody uses, and the constants and submodules left unused."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import fx

from backends.tensorrt.lowering.registry import finish


def eliminate_dead_code(gm: fx.GraphModule, sample_inputs: Sequence[Any]) -> fx.GraphModule:
    """Remove dead pure nodes (placeholders stay: the calling convention does not change)."""
    before = len(gm.graph.nodes)
    gm.graph.eliminate_dead_code()
    removed = before - len(gm.graph.nodes)
    used = {n.target for n in gm.graph.nodes if n.op in ("get_attr", "call_module")}
    dropped = [
        name
        for name in [
            *dict(gm.named_buffers(recurse=False)),
            *dict(gm.named_parameters(recurse=False)),
        ]
        if name not in used and name.startswith("_frozen")
    ]
    for name in dropped:
        delattr(gm, name)
    gm.delete_all_unused_submodules()
    changes = [f"removed {removed} dead node(s)"] if removed else []
    changes += [f"dropped unused constant {name}" for name in dropped]
    return finish(gm, "eliminate_dead_code", changes)
