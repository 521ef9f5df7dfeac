"""Helpers for the tensorrt tests: dynamo graphs of the test models, small ATen graphs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx

from tests.models import build

aten = torch.ops.aten


def dynamo_graph(name: str) -> tuple[fx.GraphModule, list[torch.Tensor], torch.Tensor]:
    """The (single) graph dynamo hands a backend for model `name`, its inputs, eager output."""
    model, args = build(name)
    graphs: list[tuple[fx.GraphModule, list[torch.Tensor]]] = []

    def grab(gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    with torch.no_grad():
        torch._dynamo.reset()
        torch.compile(model, backend=grab)(*args)
        expected = model(*args)
    gm, inputs = graphs[0]
    return gm, inputs, expected


def aten_graph(fn: Callable[..., Any], *inputs: torch.Tensor) -> fx.GraphModule:
    """`fn` traced to an ATen graph with example values in `node.meta['val']`."""
    return make_fx(fn)(*inputs)


def targets(gm: fx.GraphModule) -> list[Any]:
    """The call_function targets of `gm`, in order."""
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]
