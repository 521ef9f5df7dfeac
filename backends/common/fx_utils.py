"""Small FX helpers several backends and the chain share: one copy of each.

What a node calls (`op_name`, `bare_op_name`), the ops a block calls (`op_counts`), a
dotted attribute of a module (`fetch_attr`), the arguments and outputs of chosen calls from
one eager run (`record_calls`, `calls_of`), which inputs are module weights
(`weight_inputs`), the training-graph refusal (`grad_inputs`, `refuse_training`), the
inputs dynamo made symbolic (`symbolic_inputs`) and the names of random ops.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx
from torch.fx.node import _get_qualified_name

from backends.errors import Unsupported

# Ops whose outputs are random on every call.
RANDOM_OPS = frozenset(
    {"rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "randperm",
     "bernoulli", "bernoulli_", "multinomial", "normal", "normal_", "uniform_", "exponential_",
     "geometric_", "cauchy_", "log_normal_", "random_", "poisson"}
)  # fmt: skip
# Random only when switched on: the identity (rrelu: a fixed slope) unless training with p > 0.
GATED_RANDOM_OPS = frozenset(
    {"dropout", "dropout_", "dropout1d", "dropout2d", "dropout3d", "feature_dropout",
     "feature_dropout_", "alpha_dropout", "alpha_dropout_", "feature_alpha_dropout",
     "feature_alpha_dropout_", "native_dropout", "rrelu", "rrelu_"}
)  # fmt: skip


def op_name(node: fx.Node) -> str:
    """A stable, readable name for what a node calls: `aten.relu.default`, `torch.relu`."""
    if node.op == "call_function":
        target = node.target
        if isinstance(target, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
            return str(target)
        try:
            return _get_qualified_name(target)  # type: ignore[arg-type]
        except (AttributeError, RuntimeError, TypeError):
            return getattr(target, "__name__", repr(target))
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    if node.op == "call_module":
        owner = node.graph.owning_module
        module = owner.get_submodule(str(node.target)) if owner is not None else None
        return type(module).__name__ if module is not None else str(node.target)
    return node.op


def bare_op_name(node: fx.Node) -> str:
    """The bare name of what a node calls: 'add_' for x.add_, 'nonzero' for aten.nonzero."""
    if node.op == "call_method":
        return str(node.target)
    if isinstance(node.target, torch._ops.OpOverload):
        return node.target._opname
    return getattr(node.target, "__name__", str(node.target))


def op_counts(gm: fx.GraphModule) -> dict[str, int]:
    """How many times each call_function op is called (getitem left out): a block's work."""
    counts: dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is not operator.getitem:
            counts[op_name(node)] = counts.get(op_name(node), 0) + 1
    return counts


def fetch_attr(root: torch.nn.Module, target: str) -> Any:
    """The attribute a `get_attr` or `call_module` target names (`"sub.layer.weight"`)."""
    return operator.attrgetter(target)(root)


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


KEPT_GRAPHARG = "chain_grapharg"  # dynamo's record of an input, kept past its compile


def keep_graphargs(gm: fx.GraphModule) -> None:
    """Keep dynamo's record of where each input comes from (`meta["grapharg"]`) under a key
    of our own: dynamo deletes it once the backend's compile returns, and a backend that
    compiles the graph later (a per-shape bucket, a re-export after a weight update) reads
    it to tell weights and module floats from activations."""
    for node in gm.graph.find_nodes(op="placeholder"):
        if "grapharg" in node.meta:
            node.meta[KEPT_GRAPHARG] = node.meta["grapharg"]


def grapharg(node: fx.Node) -> Any:
    """Dynamo's record of where a placeholder's input comes from, or None."""
    return node.meta.get("grapharg", node.meta.get(KEPT_GRAPHARG))


def _is_weight(node: fx.Node, value: object) -> bool:
    """Dynamo's own record of where the input came from, else "is an nn.Parameter"."""
    source = getattr(grapharg(node), "source", None)
    if source is not None:
        from torch._dynamo.source import is_from_unspecialized_param_buffer_source

        if is_from_unspecialized_param_buffer_source(source):
            return True
        name = getattr(source, "name", "")
        text = str(name() if callable(name) else name)
        if "._parameters[" in text or "._buffers[" in text:
            return True
    elif "_parameters" in node.name or "_buffers" in node.name:  # dynamo's placeholder names
        return True
    return isinstance(value, torch.nn.Parameter)


def weight_inputs(gm: fx.GraphModule, example_inputs: Sequence[object]) -> tuple[int, ...]:
    """Positions of the inputs that are module parameters or buffers (dynamo lifts them)."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    return tuple(
        i
        for i, (node, value) in enumerate(zip(placeholders, example_inputs, strict=False))
        if isinstance(value, torch.Tensor) and _is_weight(node, value)
    )


def grad_inputs(example_inputs: Sequence[object]) -> list[int]:
    """Positions of inputs that require grad while grad mode is on (a training graph), or []."""
    if not torch.is_grad_enabled():
        return []
    return [
        i for i, x in enumerate(example_inputs) if isinstance(x, torch.Tensor) and x.requires_grad
    ]


def refuse_training(example_inputs: Sequence[object], why: str) -> None:
    """Raise Unsupported for a training graph; `why` says why this backend cannot take one."""
    needing = grad_inputs(example_inputs)
    if needing:
        raise Unsupported(
            f"training graph: {len(needing)} input(s) require grad (first at position "
            f"{needing[0]}); {why}: run under torch.no_grad() or torch.inference_mode()"
        )


SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def symbolic_inputs(gm: fx.GraphModule, example_inputs: Sequence[object]) -> list[str]:
    """The inputs dynamo made dynamic, one phrase each: a symbolic size, or a tensor whose
    traced shape or strides are symbolic ([] for a graph of fixed shapes).

    Read from the placeholders' traced values as well as the example inputs: dynamo hands
    real tensors, whose symbolic shapes only the placeholders record.
    """
    found = []
    for i, node in enumerate(gm.graph.find_nodes(op="placeholder")):
        example = example_inputs[i] if i < len(example_inputs) else None
        for val in (node.meta.get("example_value", node.meta.get("val")), example):
            if isinstance(val, SYMBOLIC):
                found.append(f"input {node.name} is a symbolic size ({val})")
                break
            if isinstance(val, torch.Tensor) and not all(
                isinstance(s, int) for s in (*val.shape, *val.stride())
            ):
                found.append(f"input {node.name} has symbolic shape {tuple(val.shape)}")
                break
    return found
