"""Steps 1-3 on any machine: ATen graph -> lowering passes -> partitions with reasons.

Everything here runs on CPU without TensorRT, so the plan for a graph (what would be an
engine, what stays in PyTorch and why, which inputs each engine sees) is testable anywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from backends.common.fx_utils import record_calls
from backends.common.partitioner import is_block_call
from backends.tensorrt.aten import real_inputs, to_aten
from backends.tensorrt.lowering import apply_lowering_passes
from backends.tensorrt.partitioning import PartitionOptions, PartitionResult, partition


@dataclass
class Plan:
    """A partitioned ATen graph, its report facts and example inputs of every engine block."""

    gm: fx.GraphModule
    result: PartitionResult
    frozen_inputs: tuple[int, ...]
    engine_inputs: dict[str, tuple[torch.Tensor, ...]] = field(default_factory=dict)

    def block(self, name: str) -> fx.GraphModule:
        """The fused submodule `name` (a plain ATen graph module)."""
        return getattr(self.gm, name)


def plan(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    options: PartitionOptions,
    dynamic: bool = False,
) -> Plan:
    """Trace, lower and partition a copy of `gm`; `gm` itself is left untouched.

    `dynamic`: dynamo's symbolic sizes stay symbolic (see `aten.to_aten`)."""
    aten = to_aten(gm, example_inputs, dynamic=dynamic)
    real = real_inputs(example_inputs)
    lowered = apply_lowering_passes(aten.gm, real)
    split, result = partition(lowered, options)
    return Plan(split, result, aten.frozen_inputs, capture_engine_inputs(split, real))


def capture_engine_inputs(
    gm: fx.GraphModule, example_inputs: Sequence[Any]
) -> dict[str, tuple[torch.Tensor, ...]]:
    """Example inputs of each engine block, by running the graph once in PyTorch."""
    calls = record_calls(gm, example_inputs, is_block_call)
    return {name: args for name, (args, _) in calls.items()}
