"""Step 1: an ATen inference graph from the dynamo graph, traced on the real example inputs.

`torch.export` (non-strict) re-traces the dynamo graph module outside dynamo's fake mode and
`run_decompositions` applies the curated table. Placeholders that dynamo lifted from module
parameters and buffers are tagged for the freezing pass.
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
    gm: fx.GraphModule, example_inputs: Sequence[Any], freeze: Sequence[int] | None = None
) -> AtenGraph:
    """Trace `gm` to a decomposed ATen graph; `freeze` defaults to its weight inputs."""
    not_tensors = [i for i, x in enumerate(example_inputs) if not isinstance(x, torch.Tensor)]
    if not_tensors:
        raise Unsupported(
            f"dynamic shapes: input(s) {not_tensors} are symbolic sizes, not tensors; "
            "compile with static shapes (the engine cache makes new sizes cheap)"
        )
    frozen = tuple(weight_inputs(gm, example_inputs) if freeze is None else freeze)
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    try:
        # torch.export patches torch for every thread while it traces (backends.cancel)
        with cancel.process_wide(), unset_fake_temporarily(), torch.no_grad():
            program = torch.export.export(gm, tuple(example_inputs), strict=False)
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


def _drop_guards(gm: fx.GraphModule) -> None:
    """Remove export's input-guard call: dynamo already guards the inputs of this graph."""
    for node in list(gm.graph.nodes):
        if node.op == "call_module" and str(node.target).startswith("_guards"):
            gm.graph.erase_node(node)
    gm.delete_all_unused_submodules()
