"""What TensorRT converts, as data (one frozen `OpSupport` row per op), and its partitioning.

A row names the ATen op (overload packet), the dtypes its tensors may have, and an optional
validator returning a reason when a particular call cannot be converted. `check(node)`
returns None when the node can go to TensorRT, else the reason it stays in PyTorch;
`partition` runs the shared partitioner (`backends.common.partitioner`) with this table.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from backends.common.partitioner import (
    EXCLUDED,
    PartitionOptions,
    PartitionResult,
    ReasonedSupport,
    is_excluded,
)
from backends.common.partitioner import partition as partition_with

aten = torch.ops.aten

FLOAT = frozenset({torch.float32, torch.float16, torch.bfloat16})
INDEX = frozenset({torch.int32, torch.int64})
BOOL = frozenset({torch.bool})
ANY = FLOAT | INDEX | BOOL | frozenset({torch.int8, torch.uint8})
MAX_RANK = 8  # TensorRT's limit on tensor dimensions

Validator = Callable[[fx.Node], "str | None"]


@dataclass(frozen=True)
class OpSupport:
    """TensorRT's support for one ATen op: allowed dtypes and an optional per-call check."""

    op: Any  # an OpOverloadPacket
    dtypes: frozenset[torch.dtype] = FLOAT
    validator: Validator | None = None

    @property
    def name(self) -> str:
        return f"aten.{self.op.__name__}"


def _no_transposed_output_padding(node: fx.Node) -> str | None:
    args = list(node.args) + [None] * 9
    transposed, output_padding = args[6], args[7]
    if transposed and output_padding and any(output_padding):
        return "transposed convolution with output_padding"
    return None


def _static_repeats(node: fx.Node) -> str | None:
    if len(node.args) > 1 and isinstance(node.args[1], fx.Node):
        return "data-dependent shape: repeats given as a tensor"
    return None


def _rows() -> Iterable[OpSupport]:
    for op in (
        aten.linear, aten.addmm, aten.mm, aten.bmm, aten.matmul, aten.baddbmm,
        aten._softmax, aten.softmax, aten._log_softmax, aten.log_softmax,
        aten.layer_norm, aten.native_layer_norm, aten.group_norm, aten.native_group_norm,
        aten._native_batch_norm_legit_no_training, aten.batch_norm,
        aten.gelu, aten.relu, aten.silu, aten.sigmoid, aten.tanh, aten.hardswish,
        aten.hardsigmoid, aten.hardtanh, aten.leaky_relu, aten.elu, aten.erf,
        aten.exp, aten.log, aten.sqrt, aten.rsqrt, aten.reciprocal, aten.sin, aten.cos,
        aten.pow, aten.div, aten.mean, aten.var, aten.amax, aten.amin,
        aten.adaptive_avg_pool2d, aten._adaptive_avg_pool2d, aten.avg_pool2d,
        aten.max_pool2d, aten.max_pool2d_with_indices,
        aten.scaled_dot_product_attention, aten.upsample_nearest2d, aten.upsample_bilinear2d,
    ):  # fmt: skip
        yield OpSupport(op)
    for op in (aten.convolution, aten.conv2d, aten.conv1d):
        yield OpSupport(op, validator=_no_transposed_output_padding)
    for op in (
        aten.add, aten.sub, aten.mul, aten.neg, aten.abs, aten.sum, aten.clamp, aten.maximum,
        aten.minimum, aten.where, aten.eq, aten.ne, aten.lt, aten.le, aten.gt, aten.ge,
        aten.reshape, aten.view, aten._unsafe_view, aten.permute, aten.transpose, aten.t,
        aten.unsqueeze, aten.squeeze, aten.flatten, aten.cat, aten.stack, aten.slice,
        aten.select, aten.split, aten.split_with_sizes, aten.chunk, aten.unbind,
        aten.expand, aten.clone, aten.contiguous, aten.alias, aten._to_copy,
        aten.full_like, aten.zeros_like, aten.ones_like, aten.index_select, aten.gather,
        aten.argmax, aten.argmin, aten.logical_not, aten.logical_and, aten.logical_or,
    ):  # fmt: skip
        yield OpSupport(op, dtypes=ANY)
    yield OpSupport(aten.repeat, dtypes=ANY, validator=_static_repeats)
    yield OpSupport(aten.embedding, dtypes=FLOAT | INDEX)


SUPPORT_TABLE: dict[Any, OpSupport] = {row.op: row for row in _rows()}

# Ops whose output shape depends on tensor values: TensorRT needs shapes at build time.
DATA_DEPENDENT = frozenset(
    getattr(aten, n)
    for n in ("nonzero", "unique", "_unique2", "unique_consecutive", "masked_select", "item")
    if hasattr(aten, n)
)
# Reasons, one vocabulary (the report groups by them).
NO_CONVERTER = "no TensorRT converter"
DATA_DEPENDENT_SHAPE = "data-dependent shape"


def check(node: fx.Node) -> str | None:
    """None when `node` converts to TensorRT, else the reason it stays in PyTorch."""
    if node.target is operator.getitem:
        return None
    packet = getattr(node.target, "overloadpacket", None)
    if packet in DATA_DEPENDENT or _has_unbacked_dims(node):
        return DATA_DEPENDENT_SHAPE
    row = SUPPORT_TABLE.get(packet)
    if row is None:
        return NO_CONVERTER
    for value in _tensor_values(node):
        if value.dtype not in row.dtypes:
            return f"dtype {str(value.dtype).removeprefix('torch.')} not supported by {row.name}"
        if value.dim() > MAX_RANK:
            return f"rank {value.dim()} > {MAX_RANK}"
    return row.validator(node) if row.validator else None


def _tensor_values(node: fx.Node) -> list[torch.Tensor]:
    """The example values (meta['val']) of the node's tensor inputs and outputs."""
    values: list[Any] = [node.meta.get("val")]
    values += [n.meta.get("val") for n in node.all_input_nodes]
    flat: list[torch.Tensor] = []
    for value in values:
        items = value if isinstance(value, (list, tuple)) else [value]
        flat += [v for v in items if isinstance(v, torch.Tensor)]
    return flat


def _has_unbacked_dims(node: fx.Node) -> bool:
    for value in _tensor_values(node)[:1]:
        for size in value.shape:
            if isinstance(size, torch.SymInt) and free_unbacked(size):
                return True
    return False


def free_unbacked(size: torch.SymInt) -> bool:
    """Whether a symbolic size depends on tensor data (an unbacked symbol)."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    return bool(free_unbacked_symbols(size))


def tensorrt_support(excluded: frozenset[str]) -> ReasonedSupport:
    """Operator support from the table, minus the ops the user keeps in PyTorch."""
    return ReasonedSupport(lambda node: EXCLUDED if is_excluded(node, excluded) else check(node))


def partition(
    gm: fx.GraphModule, options: PartitionOptions
) -> tuple[fx.GraphModule, PartitionResult]:
    """Fuse TensorRT-able blocks of `gm` (in place) into submodules; say why the rest is not."""
    return partition_with(gm, options, tensorrt_support(options.torch_executed_ops))
