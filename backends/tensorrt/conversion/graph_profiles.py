"""Whether a graph with symbolic sizes can get TensorRT optimization profiles, and which.

A dynamo graph qualifies when every symbol of its inputs has a finite range (dynamo's or
export's shape environment: e.g. a length bounded by the position embeddings) and every
symbolic dim is a plain symbol. An engine block's profiles (conversion.profiles) cut that
range at the example size (TensorRT's opt point) and at `sizes` (the bucket edges asked
for); a tail covers the rest up to the range's end. CPU only: no TensorRT here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch
from torch import fx

from backends.tensorrt.conversion.profiles import (
    Profile,
    Range,
    bucket_profiles,
    input_dims,
    symbol_ranges,
)


def _free_symbols(gm: fx.GraphModule) -> tuple[set[str], list[str]]:
    """The symbols of the graph's inputs, and the symbolic dims that are expressions."""
    symbols: set[str] = set()
    expressions: list[str] = []
    for node in gm.graph.find_nodes(op="placeholder"):
        value = node.meta.get("val", node.meta.get("example_value"))
        sizes = value.shape if isinstance(value, torch.Tensor) else (value,)
        for size in sizes:
            if not isinstance(size, torch.SymInt):
                continue
            expr = size.node.expr
            symbols.update(str(s) for s in expr.free_symbols)
            plain = isinstance(expr, sympy.Symbol) or not expr.free_symbols
            if not plain and isinstance(value, torch.Tensor):
                expressions.append(f"{node.name}: {expr}")
    return symbols, expressions


def profile_refusal(gm: fx.GraphModule) -> str | None:
    """Why the symbolic graph `gm` cannot get optimization profiles; None when it can
    (or has no symbolic size at all)."""
    symbols, expressions = _free_symbols(gm)
    if not symbols:
        return None
    if expressions:
        return f"a symbolic dim is an expression, not a size symbol ({expressions[0]})"
    ranges = symbol_ranges(gm)
    missing = sorted(s for s in symbols if s not in ranges)
    if missing:
        return f"no range known for symbol(s) {missing}"
    unbounded = sorted(s for s in symbols if ranges[s].upper is None)
    if unbounded:
        where = ", ".join(f"{s} >= {ranges[s].lower}" for s in unbounded)
        return f"symbol(s) without an upper bound ({where}): an optimization profile needs a max"
    return None


def block_profiles(
    block: fx.GraphModule, example_inputs: Sequence[Any], sizes: Sequence[int] = ()
) -> list[Profile]:
    """Profiles for an engine block, keyed by placeholder name ([] when its sizes are all
    fixed). ValueError with the reason when the block cannot get them."""
    reason = profile_refusal(block)
    if reason is not None:
        raise ValueError(reason)
    dims = input_dims(block)
    symbols = sorted({d for shape in dims.values() for d in shape if isinstance(d, str)})
    if not symbols:
        return []
    ranges = symbol_ranges(block)
    point = example_point(block, example_inputs, symbols)
    cuts = [v for v in sorted(set(sizes)) if all(_within(ranges[s], v) for s in symbols)]
    hot = [point] + [dict.fromkeys(symbols, v) for v in cuts if dict.fromkeys(symbols, v) != point]
    tail = max(ranges[s].upper or 0 for s in symbols)
    return bucket_profiles(dims, ranges, hot, tail_max=tail)


def example_point(
    block: fx.GraphModule, example_inputs: Sequence[Any], symbols: Sequence[str]
) -> dict[str, int]:
    """Each symbol's value in the example inputs (the size the graph was traced at)."""
    dims = input_dims(block)
    names = [n.name for n in block.graph.find_nodes(op="placeholder")]
    point: dict[str, int] = {}
    for name, value in zip(names, example_inputs, strict=True):
        if name in dims and isinstance(value, torch.Tensor):
            for d, size in zip(dims[name], value.shape, strict=True):
                if isinstance(d, str):
                    point[d] = int(size)
    missing = [s for s in symbols if s not in point]
    if missing:
        raise ValueError(f"no example size for symbol(s) {missing}")
    return point


def _within(r: Range, value: int) -> bool:
    return value >= r.lower and (r.upper is None or value <= r.upper)
