"""A call's concrete sizes as a dict key, and the graph specialized to them.

A graph with symbolic sizes gets its sizes two ways at each call: as int inputs (the
symbols dynamo lifted) and as the shapes of the tensors whose traced shape is symbolic.
The key holds both (and those tensors' strides: a fixed-shape compile assumes them), read
at positions found once, so a call's lookup is a tuple and one dict access.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from backends.common.fx_utils import SYMBOLIC

Key = tuple[Any, ...]


def _traced(node: fx.Node, example: Any) -> Any:
    """What dynamo traced at a placeholder: its meta value, else the example input."""
    return node.meta.get("example_value", node.meta.get("val", example))


def _symbolic_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and not all(
        isinstance(s, int) for s in (*value.shape, *value.stride())
    )


class ShapeKey:
    """The positions of a graph's symbolic inputs, and the key of a call's sizes there."""

    __slots__ = ("names", "sizes", "tensors")

    def __init__(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> None:
        self.sizes: list[int] = []  # int inputs that are symbols in the graph
        self.tensors: list[int] = []  # tensor inputs with a symbolic shape or stride
        self.names: dict[int, str] = {}
        for i, node in enumerate(gm.graph.find_nodes(op="placeholder")):
            value = _traced(node, example_inputs[i] if i < len(example_inputs) else None)
            if isinstance(value, SYMBOLIC):
                self.sizes.append(i)
            elif _symbolic_tensor(value):
                self.tensors.append(i)
            else:
                continue
            self.names[i] = node.name

    def __bool__(self) -> bool:
        return bool(self.sizes or self.tensors)

    def __call__(self, args: Sequence[Any]) -> Key:
        """The key of this call's sizes (cheap: read on every call of the graph)."""
        return (
            *[args[i] for i in self.sizes],
            *[(args[i].shape, args[i].stride()) for i in self.tensors],
        )

    def encode(self, key: Key) -> list[Any]:
        """The key as JSON (for the decision store): ints, and [shape, stride] per tensor."""
        n = len(self.sizes)
        return [*key[:n], *[[list(shape), list(stride)] for shape, stride in key[n:]]]

    def decode(self, data: Any) -> Key:
        """The key `encode` wrote, equal (and hashed alike) to the key of a call of those
        sizes; ValueError when it does not fit this graph's symbolic inputs."""
        n, m = len(self.sizes), len(self.tensors)
        if not isinstance(data, list) or len(data) != n + m:
            raise ValueError(f"a shape key of this graph holds {n + m} values, got {data!r}")
        sizes = data[:n]
        if not all(type(v) is int for v in sizes):
            raise ValueError(f"sizes should be ints, got {sizes!r}")
        tensors = []
        for pair in data[n:]:
            ok = isinstance(pair, list) and len(pair) == 2
            ok = ok and all(isinstance(p, list) for p in pair)
            if not ok or not all(type(v) is int for p in pair for v in p):
                raise ValueError(f"a tensor's sizes should be [shape, stride] ints, got {pair!r}")
            tensors.append((tuple(pair[0]), tuple(pair[1])))
        return (*sizes, *tensors)

    def describe(self, args: Sequence[Any]) -> str:
        """The key for people: `s0=16, l_x_ (2, 16)`."""
        parts = [f"{self.names[i]}={args[i]}" for i in self.sizes]
        parts += [f"{self.names[i]} {tuple(args[i].shape)}" for i in self.tensors]
        return ", ".join(parts)


def specialize(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of `gm` without its traced (symbolic) values, for a backend to compile for the
    concrete inputs it is given: a fixed-shape backend then takes it (the registry's
    `dynamic=False` check reads those values) and a compiler traces it at fixed sizes."""
    graph = copy.deepcopy(gm.graph)
    for node in graph.nodes:
        node.meta.pop("example_value", None)
        node.meta.pop("val", None)
    return fx.GraphModule(gm, graph)
