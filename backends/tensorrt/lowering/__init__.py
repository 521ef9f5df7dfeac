"""ATen lowering passes for TensorRT, with the API of the Torch-TensorRT lowering guide.

    @aten_lowering_pass              # append
    @aten_lowering_pass(index=0)     # insert at the front
    print(dump_lowering_passes())
    apply_lowering_passes(gm, sample_inputs)
    remove_lowering_pass(index=1)

`lowering_passes` is the registry object; `lowering_passes.snapshot()` restores it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import fx

from backends.tensorrt.lowering.passes import DEFAULT_PASSES
from backends.tensorrt.lowering.registry import (
    LoweringPass,
    LoweringPassError,
    LoweringPassRegistry,
    RegistryBoundDecorator,
)

lowering_passes = LoweringPassRegistry(DEFAULT_PASSES)
aten_lowering_pass = RegistryBoundDecorator(lowering_passes)


def dump_lowering_passes() -> str:
    """The registered passes in the order they run, as text."""
    return lowering_passes.dump()


def apply_lowering_passes(gm: fx.GraphModule, sample_inputs: Sequence[Any]) -> fx.GraphModule:
    """Run the registered passes in order on `gm` (in place) and return it."""
    return lowering_passes.apply(gm, sample_inputs)


def remove_lowering_pass(index: int) -> LoweringPass:
    """Remove the pass at `index` and return it."""
    return lowering_passes.remove(index)


__all__ = [
    "LoweringPass",
    "LoweringPassError",
    "LoweringPassRegistry",
    "apply_lowering_passes",
    "aten_lowering_pass",
    "dump_lowering_passes",
    "lowering_passes",
    "remove_lowering_pass",
]
