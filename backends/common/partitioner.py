"""The reasoned capability partitioner: compiled blocks and PyTorch parts, with a reason per op.

torch.fx's `CapabilityBasedPartitioner` groups the nodes a backend supports (a
`ReasonedSupport` predicate: TensorRT's converter table, the ONNX exporter's op coverage)
into maximal acyclic blocks; blocks smaller than `min_block_size` stay in PyTorch unless
they are the whole graph (no boundary to pay for then). Each node left to PyTorch gets a
reason; the result groups them by op for the report. Used by the TensorRT backend and by
ONNX Runtime's export of graphs it cannot take whole.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner, Partition
from torch.fx.passes.operator_support import OperatorSupportBase

from backends.common.fx_utils import fetch_attr, op_name
from backends.errors import Unsupported

BLOCK_PREFIX = "_run_on_acc_"  # the fused submodules' names: `_run_on_acc_0`, ...
EXCLUDED = "excluded by torch_executed_ops"


@dataclass(frozen=True)
class PartitionOptions:
    """How to partition: the smallest block worth compiling, ops the user keeps in PyTorch."""

    min_block_size: int = 5
    torch_executed_ops: frozenset[str] = frozenset()
    require_full_compilation: bool = False


@dataclass
class PartitionResult:
    """Where the ops went: counts, compiled block submodule names, and why the rest stayed."""

    ops_total: int
    ops_compiled: int
    blocks: list[str]
    fallback: dict[str, dict[str, int]] = field(default_factory=dict)

    def add_fallback(self, op: str, reason: str, count: int = 1) -> None:
        """Record `count` calls of `op` left to PyTorch for `reason`."""
        by_reason = self.fallback.setdefault(op, {})
        by_reason[reason] = by_reason.get(reason, 0) + count

    def leave_to_pytorch(self, block: str, histogram: dict[str, int], reason: str) -> None:
        """Block `block` (with these op counts) runs in PyTorch after all, for `reason`."""
        for op, count in histogram.items():
            self.add_fallback(op, reason, count)
        self.ops_compiled -= sum(histogram.values())
        self.blocks.remove(block)

    def details(self, backend: str) -> dict[str, Any]:
        """JSON-able facts for the report's `chain_details` (`ops_<backend>`: compiled ops)."""
        return {
            "ops_total": self.ops_total,
            f"ops_{backend}": self.ops_compiled,
            "engines": len(self.blocks),
            "fallback": {op: dict(r) for op, r in sorted(self.fallback.items())},
        }


class ReasonedSupport(OperatorSupportBase):
    """A partitioner predicate from `reason(node) -> str | None`; remembers each refusal."""

    def __init__(self, reason: Callable[[fx.Node], str | None]) -> None:
        super().__init__()
        self.reason = reason
        self.reasons: dict[fx.Node, str] = {}

    def is_node_supported(self, submodules: Any, node: fx.Node) -> bool:
        if node.op != "call_function":
            return False
        reason = self.reason(node)
        if reason is not None:
            self.reasons[node] = reason
        return reason is None


def is_excluded(node: fx.Node, excluded: frozenset[str]) -> bool:
    """Whether the user asked to run this op in PyTorch (`aten.relu` or `aten.relu.default`)."""
    name = op_name(node)
    packet = name.rsplit(".", 1)[0] if name.count(".") >= 2 else name
    return bool({name, packet, f"torch.ops.{name}", f"torch.ops.{packet}"} & excluded)


def is_compute(node: fx.Node) -> bool:
    """An op that does work: call_function other than tuple indexing."""
    return node.op == "call_function" and node.target is not operator.getitem


def partition(
    gm: fx.GraphModule, options: PartitionOptions, support: ReasonedSupport
) -> tuple[fx.GraphModule, PartitionResult]:
    """Fuse the blocks `support` accepts (in place) into submodules; say why not the rest."""
    compute = [n for n in gm.graph.nodes if is_compute(n)]
    partitioner = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True)
    kept: list[Partition] = []
    small_reasons: dict[fx.Node, str] = {}
    for part in partitioner.propose_partitions():
        size = sum(1 for n in part.nodes if is_compute(n))
        if size >= options.min_block_size or size == len(compute):
            kept.append(part)
            continue
        reason = f"block too small ({size} < min_block_size={options.min_block_size})"
        small_reasons.update({n: reason for n in part.nodes if is_compute(n)})
    in_blocks = sum(1 for p in kept for n in p.nodes if is_compute(n))
    result = PartitionResult(ops_total=len(compute), ops_compiled=in_blocks, blocks=[])
    for node in compute:
        reason = support.reasons.get(node) or small_reasons.get(node)
        if reason is not None:
            result.add_fallback(op_name(node), reason)
    if options.require_full_compilation and result.fallback:
        raise Unsupported(
            f"require_full_compilation: {result.ops_total - in_blocks} op(s) would run in "
            f"PyTorch ({summarize(result.fallback)})"
        )
    if kept:
        gm = partitioner.fuse_partitions(kept, prefix=BLOCK_PREFIX)
    result.blocks = [str(n.target) for n in gm.graph.nodes if is_block_call(n)]
    for node in gm.graph.nodes:
        if is_block_call(node):
            inline_constants(gm, node)
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()
    return gm, result


def is_block_call(node: fx.Node) -> bool:
    """A call of a fused block."""
    return node.op == "call_module" and str(node.target).startswith(BLOCK_PREFIX)


def summarize(fallback: dict[str, dict[str, int]], limit: int = 3) -> str:
    """`aten.foo: reason (n); ...` for the first few ops, the way a report line wants it."""
    items = [f"{op}: {', '.join(reasons)}" for op, reasons in sorted(fallback.items())]
    more = f"; and {len(items) - limit} more" if len(items) > limit else ""
    return "; ".join(items[:limit]) + more


def inline_constants(gm: fx.GraphModule, call: fx.Node) -> None:
    """Move the constants a block reads from the parent into the block itself.

    The fuser passes `get_attr` values as block inputs; compilers want weights as constants
    (ONNX initializers), so each becomes a buffer of the block. The buffer is a plain
    tensor (the parameter detached, same storage): a block left to PyTorch is traced by
    torch.export, which would lift an `nn.Parameter` buffer as a Parameter constant that
    `ExportedProgram.module()` cannot re-register.
    """
    block: fx.GraphModule = getattr(gm, str(call.target))
    placeholders = [n for n in block.graph.nodes if n.op == "placeholder"]
    keep_args = []
    for arg, placeholder in zip(call.args, placeholders, strict=True):
        if not (isinstance(arg, fx.Node) and arg.op == "get_attr"):
            keep_args.append(arg)
            continue
        value = fetch_attr(gm, str(arg.target))
        if isinstance(value, torch.Tensor):
            value = value.detach()
        name = f"_const_{placeholder.name}"
        block.register_buffer(name, value, persistent=False)
        with block.graph.inserting_before(placeholder):
            const = block.graph.get_attr(name)
        const.meta.update(placeholder.meta)
        placeholder.replace_all_uses_with(const)
        block.graph.erase_node(placeholder)
    call.args = tuple(keep_args)
    block.graph.lint()
    block.recompile()


def block_calls(gm: fx.GraphModule) -> Iterable[fx.Node]:
    """The call_module nodes of the fused blocks, in graph order."""
    return (n for n in gm.graph.nodes if is_block_call(n))
