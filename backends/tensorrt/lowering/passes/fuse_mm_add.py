"""Fuse `mm(a, b) + bias` into `addmm(bias, a, b)`: one GEMM with bias instead of two ops.

Decompositions and user code (`x @ w + b`) produce this pair; TensorRT and the ONNX
exporter map `addmm` to a single Gemm, and the pair would otherwise cost an extra pass
over the output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import fx

from backends.tensorrt.lowering.registry import aten, finish, is_op, replace_node


def fuse_mm_add(gm: fx.GraphModule, sample_inputs: Sequence[Any]) -> fx.GraphModule:
    """Rewrite `add.Tensor(mm(a, b), c)` (either order, alpha 1) as `addmm(c, a, b)`."""
    changes = []
    for node in list(gm.graph.nodes):
        if not is_op(node, aten.add.Tensor) or node.kwargs.get("alpha", 1) != 1:
            continue
        if len(node.args) != 2 or not all(isinstance(a, fx.Node) for a in node.args):
            continue
        first, second = node.args
        mm, bias = (first, second) if is_op(first, aten.mm.default) else (second, first)
        if not is_op(mm, aten.mm.default) or len(mm.users) != 1:
            continue
        if not _broadcasts_to(bias, mm):
            continue
        with gm.graph.inserting_before(node):
            addmm = gm.graph.call_function(aten.addmm.default, args=(bias, *mm.args))
        addmm.meta.update(node.meta)
        replace_node(node, addmm)
        gm.graph.erase_node(mm)
        changes.append(f"{mm.name} + {bias.name} -> {addmm.name}")
    return finish(gm, "fuse_mm_add", changes)


def _broadcasts_to(bias: fx.Node, mm: fx.Node) -> bool:
    """addmm needs a bias broadcastable to the product without changing the result shape."""
    b, m = bias.meta.get("val"), mm.meta.get("val")
    if b is None or m is None or b.dim() > 2 or b.dtype != m.dtype:
        return False
    shape = [1] * (2 - b.dim()) + list(b.shape)
    return all(s in (1, t) for s, t in zip(shape, m.shape, strict=True))
