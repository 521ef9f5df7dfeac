"""Step 1: an ATen inference graph from the dynamo graph, traced on the real example inputs.

`torch.export` (non-strict) re-traces the dynamo graph module outside dynamo's fake mode and
`run_decompositions` applies the curated table. With `dynamic=True` the dims dynamo made
symbolic (and its SymInt inputs) stay symbolic in the trace (`Dim.DYNAMIC`), so the blocks
export to ONNX with dynamic axes for an engine with optimization profiles. Placeholders
that dynamo lifted from module parameters and buffers are tagged for the freezing pass.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from backends import cancel
from backends.common.fx_utils import weight_inputs
from backends.common.onnx_prepare import symbolic_dims
from backends.errors import Unsupported
from backends.tensorrt.decompositions import decomposition_table

logger = logging.getLogger(__name__)
FREEZE = "tensorrt_freeze"  # node.meta key: this input is a weight, to become a constant


@dataclass
class AtenGraph:
    """The ATen graph module and which of its inputs are frozen weights."""

    gm: fx.GraphModule
    frozen_inputs: tuple[int, ...]


def to_aten(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    freeze: Sequence[int] | None = None,
    dynamic: bool = False,
) -> AtenGraph:
    """Trace `gm` to a decomposed ATen graph; `freeze` defaults to its weight inputs.

    `dynamic`: keep dynamo's symbolic dims and SymInt inputs symbolic (else a SymInt input
    declines: a static trace would bake one size into the graph)."""
    not_tensors = [i for i, x in enumerate(example_inputs) if not isinstance(x, torch.Tensor)]
    if not_tensors and not dynamic:
        raise Unsupported(
            f"dynamic shapes: input(s) {not_tensors} are symbolic sizes, not tensors; "
            "compile with static shapes (the engine cache makes new sizes cheap)"
        )
    frozen = tuple(weight_inputs(gm, example_inputs) if freeze is None else freeze)
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    args = real_inputs(example_inputs)
    shapes = dynamic_shapes(gm, example_inputs) if dynamic else None
    try:
        # torch.export patches torch for every thread while it traces (backends.cancel)
        with cancel.process_wide(), unset_fake_temporarily(), torch.no_grad():
            program = torch.export.export(gm, args, dynamic_shapes=shapes, strict=False)
            program = program.run_decompositions(decomposition_table())
            aten_gm = program.module()
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise Unsupported(
            f"torch.export could not trace the graph: {first}", detail=traceback.format_exc()
        ) from e
    _drop_guards(aten_gm)
    placeholders = [n for n in aten_gm.graph.nodes if n.op == "placeholder"]
    for i in frozen:
        placeholders[i].meta[FREEZE] = True
    aten_gm.recompile()
    return AtenGraph(aten_gm, frozen)


def real_inputs(example_inputs: Sequence[Any]) -> tuple[Any, ...]:
    """The example inputs with SymInts as their concrete ints (what a trace runs on).

    Read from the SymInt's hint: `int(x)` would add a guard that specializes the symbol
    in dynamo's shape environment (its graph would then stop being dynamic)."""
    return tuple(_hint(x) if isinstance(x, torch.SymInt) else x for x in example_inputs)


def _hint(value: torch.SymInt) -> int:
    hint = value.node.hint
    if hint is None:
        raise Unsupported(f"dynamic shapes: the size {value} has no concrete example value")
    return int(hint)


def dynamic_shapes(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> tuple[Any, ...]:
    """torch.export's `dynamic_shapes`: every dim dynamo made symbolic, and every SymInt
    input, is `Dim.DYNAMIC` (export infers how they relate); everything else is static."""
    from torch.export import Dim

    dims = symbolic_dims(gm, example_inputs)
    spec: list[Any] = []
    for i, value in enumerate(example_inputs):
        if isinstance(value, torch.SymInt):
            spec.append(Dim.DYNAMIC)
        elif i in dims:
            spec.append(dict.fromkeys(dims[i], Dim.DYNAMIC))
        else:
            spec.append(None)
    return tuple(spec)


def _drop_guards(gm: fx.GraphModule) -> None:
    """Remove export's input-guard call: dynamo already guards the inputs of this graph."""
    for node in list(gm.graph.nodes):
        if node.op == "call_module" and str(node.target).startswith("_guards"):
            gm.graph.erase_node(node)
    gm.delete_all_unused_submodules()
