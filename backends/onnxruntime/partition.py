"""ONNX Runtime parts of a graph ORT cannot take whole: partition, export, verify per part.

The partitioner is the shared one (`backends.common.partitioner`: torch.fx's
CapabilityBasedPartitioner with reasons per op) with ONNX's predicate: an op goes to ONNX
Runtime when the ONNX exporter has a translation for it (torchlib's registry) or a
decomposition it applies first. Each part is exported with the project's one exporter
(`export_onnx`) and checked by the chain against PyTorch on the example inputs; a part that
fails either stays in PyTorch, with the reason.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import operator
from collections.abc import Callable
from typing import Any

import sympy
import torch
from torch import fx

from backends.common.fx_utils import calls_of, op_counts, op_name, record_calls
from backends.common.onnx_export import export_onnx
from backends.common.partitioner import (
    EXCLUDED,
    PartitionOptions,
    PartitionResult,
    ReasonedSupport,
    is_excluded,
    partition,
)
from backends.common.parts import Part, flat_outputs
from backends.common.payload import Dim, Header, SizeOf, TensorSpec
from backends.common.quiet import quiet
from backends.errors import Unsupported

NO_TRANSLATION = "no ONNX translation (torch.onnx / onnxscript torchlib)"
SIZE = "a symbolic size (computed in PyTorch; parts read sizes from their inputs' shapes)"


@functools.cache
def _onnx_ops() -> tuple[Any, frozenset[Any]]:
    """The exporter's registry of translated ops and the decompositions it applies first."""
    from torch.onnx._internal.exporter._registration import ONNXRegistry

    with quiet():
        registry = ONNXRegistry.from_torchlib()
    return registry, frozenset(torch.export.default_decompositions())


def ort_reason(node: fx.Node, excluded: frozenset[str] = frozenset()) -> str | None:
    """None when the ONNX exporter can translate `node`, else why it stays in PyTorch."""
    if node.target is operator.getitem:
        return None
    if isinstance(node.meta.get("val"), torch.SymInt | torch.SymFloat | torch.SymBool):
        return SIZE  # a part's sizes are read from its inputs' shapes inside the model
    if is_excluded(node, excluded):
        return EXCLUDED
    if not isinstance(node.target, torch._ops.OpOverload):
        return f"not an ATen op ({op_name(node)})"
    registry, decomposed = _onnx_ops()
    if registry.is_registered(node.target) or node.target in decomposed:
        return None
    return NO_TRANSLATION


def ort_support(excluded: frozenset[str]) -> ReasonedSupport:
    """The ONNX exporter's op coverage as a partitioner predicate."""
    return ReasonedSupport(lambda node: ort_reason(node, excluded))


HeaderFn = Callable[[Any, list[torch.Tensor], str], Header]  # (OnnxGraph, outputs, device)


def ort_parts(
    gm: fx.GraphModule,
    flat_inputs: tuple[Any, ...],
    options: PartitionOptions,
    header: HeaderFn,
    verify: Callable[[Part], str | None],
    dynamic: bool = False,
) -> tuple[fx.GraphModule, dict[str, Part], PartitionResult]:
    """Partition a copy of `gm`; export and verify each ORT part; say why the rest stayed.
    `dynamic`: each part takes the symbolic sizes of its inputs (`export_part`)."""
    split, result = partition(
        copy.deepcopy(gm), options, support=ort_support(options.torch_executed_ops)
    )
    calls = record_calls(split, flat_inputs, calls_of(set(result.blocks)))
    parts: dict[str, Part] = {}
    for name in list(result.blocks):
        args, out = calls[name]
        block = getattr(split, name)
        try:
            part = export_part(name, block, args, out, header, dynamic)
            reason = verify(part)
            if reason is not None:
                raise Unsupported(f"mismatch against PyTorch: {reason}")
        except Unsupported as error:
            result.leave_to_pytorch(name, op_counts(block), f"onnxruntime: {error.reason}")
            continue
        parts[name] = part
    return split, parts, result


def export_part(
    name: str,
    block: fx.GraphModule,
    args: tuple[Any, ...],
    out: Any,
    header: HeaderFn,
    dynamic: bool = False,
) -> Part:
    """Export one block to ONNX, with PyTorch's outputs on `args` as what it must reproduce.

    `dynamic`: the dims that are symbolic in the block's placeholders (a capture with
    `dynamic_shapes`) become dynamic axes, and the header's output sizes say which input
    sizes they follow (`SizeOf`), for the op's shape function.
    """
    outputs, returns_tuple = flat_outputs(out)
    if not all(isinstance(o, torch.Tensor) for o in outputs):
        raise Unsupported("part returns sizes, not only tensors (PyTorch computes them)")
    dims = symbolic_dims(block) if dynamic else {}
    if dims:
        _placeholders_first(block)
    graph = export_onnx(block, args, freeze=(), dynamic_dims=dims)
    # a size argument is derived inside the model from an input's shape (the same symbol,
    # so the same value at any size): only with dynamic axes, where sizes are symbols
    if (graph.derived and not dims) or graph.scalars:
        raise Unsupported("part reads sizes or module scalars from its inputs")
    device = args[graph.input_positions[0]].device if graph.input_positions else outputs[0].device
    made = header(graph, outputs, device.type)
    if dims:
        shapes = symbolic_outputs(block, graph.input_positions)
        specs = tuple(
            TensorSpec(shape, spec.dtype) for shape, spec in zip(shapes, made.outputs, strict=True)
        )
        made = dataclasses.replace(made, outputs=specs)
    return Part(
        name=name,
        header=made,
        body=graph.model,
        input_positions=graph.input_positions,
        returns_tuple=returns_tuple,
        ops=sum(op_counts(block).values()),
        example_inputs=args,
        expected=tuple(outputs),
        graph=block,
    )


def _placeholders_first(block: fx.GraphModule) -> None:
    """Move the block's placeholders (in their order) before its other nodes: the
    partitioner places them where first used, after some constants, and the exporter's
    preparation inserts size reads from them before the first non-placeholder node."""
    placeholders = list(block.graph.find_nodes(op="placeholder"))
    first = next(iter(block.graph.nodes))
    for node in reversed(placeholders):
        first.prepend(node)
        first = node
    block.graph.lint()
    block.recompile()


def _value(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, fx.Node) else node


def symbolic_dims(block: fx.GraphModule) -> dict[int, tuple[int, ...]]:
    """Input position -> the dims whose size in the placeholder's value is a symbol."""
    dims: dict[int, tuple[int, ...]] = {}
    for position, node in enumerate(block.graph.find_nodes(op="placeholder")):
        value = _value(node)
        if isinstance(value, torch.Tensor):
            found = tuple(d for d, s in enumerate(value.shape) if _symbolic(s))
            if found:
                dims[position] = found
    return dims


def _symbolic(size: Any) -> bool:
    return isinstance(size, torch.SymInt) and not size.node.expr.is_number


def symbolic_outputs(block: fx.GraphModule, positions: tuple[int, ...]) -> list[tuple[Dim, ...]]:
    """Each output's sizes: a number, or the product of the payload's input sizes it is
    (`positions[k]` is the block input feeding payload input k). Raises Unsupported for a
    size that is another function of them (a sum, a division)."""
    placeholders = list(block.graph.find_nodes(op="placeholder"))
    symbols: dict[sympy.Symbol, tuple[int, int]] = {}
    for k, position in enumerate(positions):
        value = _value(placeholders[position])
        for d, size in enumerate(value.shape if isinstance(value, torch.Tensor) else ()):
            if _symbolic(size) and isinstance(size.node.expr, sympy.Symbol):
                symbols.setdefault(size.node.expr, (k, d))
    output = next(n for n in reversed(block.graph.nodes) if n.op == "output").args[0]
    nodes = output if isinstance(output, tuple | list) else (output,)
    shapes = []
    for node in nodes:
        value = _value(node)
        if not isinstance(value, torch.Tensor):
            raise Unsupported("dynamic shapes: an output without a recorded shape")
        shapes.append(tuple(_size_of(s, symbols) for s in value.shape))
    return shapes


def _size_of(size: Any, symbols: dict[sympy.Symbol, tuple[int, int]]) -> Dim:
    """A number, or `SizeOf` when `size` is an integer times a product of input sizes."""
    expr = size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(int(size))
    if expr.is_number:
        return int(expr)
    coefficient, rest = expr.as_coeff_Mul()
    factors: list[tuple[int, int]] = []
    for factor in sympy.Mul.make_args(rest):
        base, exponent = factor.as_base_exp()
        if base not in symbols or not exponent.is_Integer or exponent < 1:
            raise Unsupported(f"dynamic shapes: an output size {expr} is not a product of sizes")
        factors += [symbols[base]] * int(exponent)
    if not coefficient.is_Integer or coefficient < 1:
        raise Unsupported(f"dynamic shapes: an output size {expr} is not a product of sizes")
    return SizeOf(int(coefficient), tuple(factors))
