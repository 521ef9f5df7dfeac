"""TensorRT optimization profiles per bucket range: min/opt/max of every input, from
dynamo's symbol ranges and the shapes that turned hot (chain.run.buckets).

One profile per hot shape: each symbol's range runs from just above the next smaller hot
size (or the symbol's lower bound) up to the hot size itself, which is also the size
TensorRT tunes for (opt); a tail profile covers the sizes past the hottest one, up to the
symbol's upper bound or `tail_max`. Pure: reading the graph and computing the profiles
run on CPU; `engine.build_engine` hands them to `IOptimizationProfile.set_shape`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch
from torch import fx
from torch.utils._sympy.numbers import int_oo

Dim = int | str  # a fixed size, or a symbol's name (an expression of symbols as its text)
Shape = tuple[int, ...]


@dataclass(frozen=True)
class Range:
    """A symbol's allowed sizes as dynamo's shape environment bounds them."""

    lower: int
    upper: int | None  # None: unbounded


@dataclass(frozen=True)
class Profile:
    """One optimization profile: per input name, its (min, opt, max) shapes."""

    shapes: dict[str, tuple[Shape, Shape, Shape]]

    def to_json(self) -> dict[str, list[list[int]]]:
        """name -> [min, opt, max] as lists (engine cache metadata, the cache key)."""
        return {name: [list(s) for s in shapes] for name, shapes in sorted(self.shapes.items())}

    @classmethod
    def from_json(cls, data: Mapping[str, Sequence[Sequence[int]]]) -> Profile:
        """The profile `to_json` wrote."""
        return cls({n: tuple(tuple(int(d) for d in s) for s in v) for n, v in data.items()})  # type: ignore[misc]

    def renamed(self, names: Mapping[str, str]) -> Profile:
        """The same profile keyed by other input names (placeholder -> ONNX input)."""
        return Profile({names[n]: v for n, v in self.shapes.items() if n in names})


def _traced(node: fx.Node) -> Any:
    return node.meta.get("val", node.meta.get("example_value"))


def _dim(size: Any) -> Dim:
    if isinstance(size, int):
        return size
    expr = size.node.expr
    return str(expr.name) if isinstance(expr, sympy.Symbol) else str(expr)


def input_dims(gm: fx.GraphModule) -> dict[str, tuple[Dim, ...]]:
    """Every tensor placeholder's traced sizes: ints, and symbols by name."""
    out = {}
    for node in gm.graph.find_nodes(op="placeholder"):
        value = _traced(node)
        if isinstance(value, torch.Tensor):
            out[node.name] = tuple(_dim(s) for s in value.shape)
    return out


def symbol_ranges(gm: fx.GraphModule) -> dict[str, Range]:
    """Each size symbol's range from the shape environment of the graph's traced values."""
    for node in gm.graph.find_nodes(op="placeholder"):
        value = _traced(node)
        mode = getattr(value, "fake_mode", None)
        env = getattr(mode, "shape_env", None)
        if env is None and isinstance(value, torch.SymInt):
            env = value.node.shape_env
        if env is not None:
            return {
                str(sym.name): Range(_bound(r.lower) or 0, _bound(r.upper))
                for sym, r in env.var_to_range.items()
            }
    return {}


def _bound(value: Any) -> int | None:
    """A range bound as an int; None for an infinite one (sympy's oo, torch's int_oo)."""
    if value in (sympy.oo, -sympy.oo, int_oo, -int_oo):
        return None
    return int(value)


def bucket_profiles(
    dims: Mapping[str, Sequence[Dim]],
    ranges: Mapping[str, Range],
    hot: Sequence[Mapping[str, int]],
    tail_max: int | None,
) -> list[Profile]:
    """One profile per hot shape (sorted by size), plus a tail past the hottest up to the
    range's upper bound or `tail_max` (None: no tail). ValueError naming what cannot be a
    profile: a symbol without a range, a size outside it, a dimension that is an expression."""
    symbols = sorted({d for shape in dims.values() for d in shape if isinstance(d, str)})
    for s in symbols:
        if not s.isidentifier():
            raise ValueError(f"a dimension is the expression {s}: not a plain symbol")
        if s not in ranges:
            raise ValueError(f"no range for symbol {s}")
    if not hot:
        raise ValueError("no hot shape: nothing to build a profile for")
    points = []
    for shape in hot:
        point = {}
        for s in symbols:
            if s not in shape:
                raise ValueError(f"the hot shape gives no size for {s}")
            r, v = ranges[s], int(shape[s])
            if v < r.lower or (r.upper is not None and v > r.upper):
                raise ValueError(f"{s}={v} outside its range {r.lower}..{r.upper or 'inf'}")
            point[s] = v
        points.append(point)
    points.sort(key=lambda p: [p[s] for s in symbols])
    bounds = []  # per profile: symbol -> (min, opt, max)
    for point in points:
        bound = {}
        for s, v in point.items():
            below = [p[s] for p in points if p[s] < v]
            bound[s] = (max(below) + 1 if below else ranges[s].lower, v, v)
        bounds.append(bound)
    if tail_max is not None and symbols:
        tail = {}
        for s in symbols:
            top = max(p[s] for p in points)
            upper = ranges[s].upper
            end = min(upper, tail_max) if upper is not None else tail_max
            if end > top:
                tail[s] = (top + 1, top + 1, end)
        if len(tail) == len(symbols):
            bounds.append(tail)

    def shape(dim: Sequence[Dim], bound: Mapping[str, tuple[int, int, int]], i: int) -> Shape:
        return tuple(d if isinstance(d, int) else bound[d][i] for d in dim)

    return [
        Profile(
            {name: (shape(d, b, 0), shape(d, b, 1), shape(d, b, 2)) for name, d in dims.items()}
        )
        for b in bounds
    ]
