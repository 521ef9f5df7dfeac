"""The shipped lowering passes, in the order they run (one explicit list)."""

from __future__ import annotations

from backends.tensorrt.lowering.passes.constant_fold import constant_fold
from backends.tensorrt.lowering.passes.eliminate_dead_code import eliminate_dead_code
from backends.tensorrt.lowering.passes.fuse_mm_add import fuse_mm_add
from backends.tensorrt.lowering.passes.remove_assert_ops import remove_assert_ops
from backends.tensorrt.lowering.passes.remove_detach import remove_detach
from backends.tensorrt.lowering.passes.remove_noop_aliases import remove_noop_aliases
from backends.tensorrt.lowering.passes.remove_noop_to_copy import remove_noop_to_copy
from backends.tensorrt.lowering.passes.repair_input_as_output import repair_input_as_output
from backends.tensorrt.lowering.passes.view_to_reshape import view_to_reshape
from backends.tensorrt.lowering.registry import LoweringPass

# Order matters: clean-ups first, then rewrites, folding, dead code, and the input/output
# repair last (earlier passes remove clones, which can expose an input as an output).
DEFAULT_PASSES: tuple[LoweringPass, ...] = (
    remove_assert_ops,
    remove_detach,
    remove_noop_aliases,
    remove_noop_to_copy,
    view_to_reshape,
    fuse_mm_add,
    constant_fold,
    eliminate_dead_code,
    repair_input_as_output,
)

__all__ = [
    "DEFAULT_PASSES",
    "constant_fold",
    "eliminate_dead_code",
    "fuse_mm_add",
    "remove_assert_ops",
    "remove_detach",
    "remove_noop_aliases",
    "remove_noop_to_copy",
    "repair_input_as_output",
    "view_to_reshape",
]
