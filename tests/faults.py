"""Fault-injection backends: each breaks the contract in one precise way."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from backends.errors import Transient, Unsupported


def raises_at_compile(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    raise RuntimeError("converter exploded")


def raises_at_run(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        raise RuntimeError("kernel launch failed")

    return run


def wrong_numbers(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        return [o + 1.0 for o in gm(*args)]

    return run


def returns_nan(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        return [torch.full_like(o, float("nan")) for o in gm(*args)]

    return run


def wrong_arity(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        return [*gm(*args), torch.zeros(1)]

    return run


def not_callable(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
    return 42


def declines(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    raise Unsupported("no converter for aten.frobnicate", detail="node %7: aten.frobnicate")


def hangs(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    time.sleep(30)
    return gm.forward


class FlakyCompile:
    """Fails `failures` times with a transient error, then compiles to eager."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0
        self.__name__ = "flaky"

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        self.calls += 1
        if self.calls <= self.failures:
            raise Transient("device busy")
        return gm.forward


class BreaksLater:
    """Passes verification, then raises on the `after`-th call of the compiled graph."""

    def __init__(self, after: int = 2) -> None:
        self.after = after
        self.__name__ = "breaks_later"

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        calls = 0

        def run(*args: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls > self.after:
                raise RuntimeError("engine lost its context")
            return gm(*args)

        return run


def mutates_graph(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Breaks the contract: rewrites the graph it was given (every output doubled)."""
    output = next(n for n in gm.graph.nodes if n.op == "output")
    with gm.graph.inserting_before(output):
        doubled = [gm.graph.call_function(torch.mul, (o, 2)) for o in output.args[0]]
    output.args = (tuple(doubled),)
    gm.recompile()
    return gm.forward
