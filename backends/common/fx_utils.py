"""Small FX helpers several backends share: what a node calls, op counts, recorded calls."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx


def op_name(node: fx.Node) -> str:
    """`aten.relu.default` style name of a call_function node."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return getattr(target, "__name__", str(target))


def op_histogram(gm: fx.GraphModule) -> dict[str, int]:
    """How many times each op is called (getitem left out): for tests and reports."""
    counts: dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is not operator.getitem:
            counts[op_name(node)] = counts.get(op_name(node), 0) + 1
    return counts


class _Recorder(fx.Interpreter):
    """Runs a graph module in PyTorch; keeps the arguments and output of the chosen calls."""

    def __init__(self, gm: fx.GraphModule, chosen: Callable[[fx.Node], bool]) -> None:
        super().__init__(gm)
        self.chosen = chosen
        self.seen: dict[str, tuple[tuple[Any, ...], Any]] = {}

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        if self.chosen(n):
            args, _ = self.fetch_args_kwargs_from_env(n)
            self.seen[str(n.target)] = (tuple(args), out)
        return out


def record_calls(
    gm: fx.GraphModule, inputs: Sequence[Any], chosen: Callable[[fx.Node], bool]
) -> dict[str, tuple[tuple[Any, ...], Any]]:
    """Target -> (arguments, output) of the `chosen` nodes, from one eager run on real values.

    Runs outside any fake mode and without autograd: the example inputs are real tensors.
    """
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    recorder = _Recorder(gm, chosen)
    with unset_fake_temporarily(), torch.no_grad():
        recorder.run(*inputs)
    return recorder.seen


def calls_of(targets: set[str]) -> Callable[[fx.Node], bool]:
    """A `record_calls` predicate: the calls of these submodules."""
    return lambda n: n.op == "call_module" and str(n.target) in targets
