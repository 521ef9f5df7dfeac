"""Insert a clone where a graph input is also a graph output: TensorRT forbids that."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import fx

from backends.tensorrt.lowering.registry import aten, finish


def repair_input_as_output(gm: fx.GraphModule, sample_inputs: Sequence[Any]) -> fx.GraphModule:
    """Route each placeholder that is returned directly through an `aten.clone`."""
    changes = []
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    for node in list(gm.graph.nodes):
        if node.op != "placeholder" or output not in node.users:
            continue
        with gm.graph.inserting_after(node):
            clone = gm.graph.call_function(aten.clone.default, args=(node,))
        clone.meta.update(node.meta)
        output.replace_input_with(node, clone)
        changes.append(f"cloned input {node.name} returned as output")
    return finish(gm, "repair_input_as_output", changes)
