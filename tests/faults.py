"""Fault-injection backends: each breaks the contract in one precise way."""

from __future__ import annotations

import copy
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


# -- wrong answers that look plausible: what verification against float64 must catch -----


def _floating(out: Any) -> bool:
    return isinstance(out, torch.Tensor) and out.is_floating_point()


class Perturbed:
    """Every floating output off by a relative `rel` (default 1e-2; in bf16 eight units in
    the last place, 6e-2: there 1e-2 is 1.3 ulp, the size of rounding, not of a bug)."""

    def __init__(self, rel: float | None = None) -> None:
        self.rel = rel
        self.__name__ = "perturbed"

    def scale(self, dtype: torch.dtype) -> float:
        if self.rel is not None:
            return self.rel
        return max(1e-2, 8 * torch.finfo(dtype).eps)

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            outs = gm(*args)
            return type(outs)(o * (1 + self.scale(o.dtype)) if _floating(o) else o for o in outs)

        return run


perturbed = Perturbed()


def drops_residual(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """A lowering bug: the graph's last add of two tensors (a residual add) keeps only its
    first operand. Works on a copy: the gm it was given stays as it was (the contract)."""
    copied = copy.deepcopy(gm)
    adds = [
        n
        for n in copied.graph.nodes
        if n.op in ("call_function", "call_method")
        and getattr(n.target, "__name__", n.target) in ("add", "iadd", "__add__")
        and len(n.args) >= 2
        and all(isinstance(a, fx.Node) for a in n.args[:2])
    ]
    if not adds:
        raise Unsupported("no add of two tensors to drop")
    last = adds[-1]
    last.replace_all_uses_with(last.args[0])
    copied.graph.erase_node(last)
    copied.recompile()
    return copied.forward


def _other_inputs(inputs: list[Any]) -> list[Any]:
    """Inputs of the same shapes and other values (parameters kept), as a warm-up uses."""
    return [
        x
        if not isinstance(x, torch.Tensor) or isinstance(x, torch.nn.Parameter)
        else x + 1
        if x.is_floating_point()
        else torch.zeros_like(x)
        for x in inputs
    ]


def stale(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Returns the outputs of the previous call (a static output buffer read too early);
    the first call gets those of a warm-up on other inputs, made while compiling."""
    with torch.no_grad():
        previous = gm(*_other_inputs(list(example_inputs)))

    def run(*args: Any) -> Any:
        nonlocal previous
        outs, previous = previous, gm(*args)
        return outs

    return run


class Sleeps:
    """Right answers, slowly: sleeps `seconds` per call (measurably slower than eager).

    50 ms by default: longer than the ~24 ms stalls a busy 2-core CPU gives torch's threads.
    `sleep`: time.sleep, or a virtual clock's (tests/clock.py), which the timing reads alone.
    """

    def __init__(self, seconds: float = 0.05, sleep: Callable[[float], None] = time.sleep) -> None:
        self.seconds = seconds
        self.sleep = sleep
        self.__name__ = "sleeps"

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            self.sleep(self.seconds)
            return gm(*args)

        return run


def twin(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Eager under another name: the forward of a copy of the graph module (not
    `gm.forward` itself, which the chain recognises as its reference; a Python wrapper
    around it costs a measurable 2-4 us per call). It can only win or lose by noise."""
    copied = copy.deepcopy(gm)
    # a deep copy is a lazy graph module: until recompiled for real, its `forward` goes
    # through nn.Module.__call__ on every call (~18 us here)
    getattr(copied, "real_recompile", copied.recompile)()
    return copied.forward
