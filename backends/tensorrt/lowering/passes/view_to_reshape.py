"""Replace `view` / `_unsafe_view` with `reshape`.

`view` fails on non-contiguous inputs; once clones are removed and partitions run in
TensorRT (which has no strides), the strides a `view` relied on are not guaranteed, and
`reshape` is the one TensorRT converters and the ONNX exporter handle uniformly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import fx

from backends.tensorrt.lowering.registry import aten, finish, is_op


def view_to_reshape(gm: fx.GraphModule, sample_inputs: Sequence[Any]) -> fx.GraphModule:
    """Retarget every `aten.view.default` / `aten._unsafe_view.default` to `aten.reshape`."""
    changes = []
    for node in gm.graph.nodes:
        if is_op(node, aten.view.default, aten._unsafe_view.default):
            node.target = aten.reshape.default
            changes.append(f"{node.name} -> reshape")
    return finish(gm, "view_to_reshape", changes)
