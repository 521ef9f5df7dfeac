"""Capture a model as one ATen graph with torch.export, and hand it over the way dynamo does.

`capture` returns a plain graph module taking the flattened user inputs and returning a
flat tuple (parameters and buffers are `get_attr` nodes, as in a dynamo graph of inlined
modules), plus the pytree specs to restore the model's own calling convention at the end.
A model torch.export cannot capture in one graph raises `CaptureError` naming the construct.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree


class CaptureError(RuntimeError):
    """torch.export could not capture the model as one graph; the message names why."""


@dataclass
class Captured:
    """The flat graph module, its flat example inputs, and the model's calling convention."""

    gm: fx.GraphModule
    flat_inputs: list[Any]
    codegen: Any  # torch.export's pytree codegen: (args, kwargs) in, the model's outputs out
    # flat input position -> its dims that `dynamic_shapes` made symbolic (none: static)
    dynamic_dims: dict[int, tuple[int, ...]] = field(default_factory=dict)


_HINTS = (
    (
        "data-dependent",
        "data-dependent control flow or shape (a Python branch or size read "
        "from tensor values): use torch.cond, or compute it outside the model",
    ),
    ("graph_break", "an explicit graph break: export needs one graph"),
    ("Unsupported", "a Python construct torch.export cannot trace"),
)


def _where(text: str) -> str:
    """The first user source line torch.export's message points at, if any."""
    for pattern in (r'File "([^"]+)", line (\d+), in (\w+)\s*\n\s*(.+)', r"at (\S+\.py):(\d+)"):
        match = re.search(pattern, text)
        if match:
            groups = match.groups()
            where = f"{groups[0].rsplit('/', 1)[-1]}:{groups[1]}"
            return f"{where} ({groups[3].strip()})" if len(groups) == 4 else where
    return ""


def explain(model: torch.nn.Module, error: BaseException) -> str:
    """One paragraph: what could not be captured, where, and what to do."""
    text = str(error)
    first = next((s.strip() for s in text.splitlines() if s.strip()), type(error).__name__)
    hint = next((h for key, h in _HINTS if key.lower() in text.lower()), None)
    if hint is None and "GuardOnDataDependent" in type(error).__name__:
        hint = _HINTS[0][1]
    if re.search(r"Found <class '[\w.]*Cache'> in output", text):
        hint = (
            "the model returns its KV cache (a transformers Cache object) and programs "
            "return tensors: pass use_cache=False in kwargs (or set config.use_cache = False)"
        )
    where = _where(text)
    parts = [f"torch.export could not capture {type(model).__name__} as one graph"]
    if hint:
        parts.append(f"cause: {hint}")
    if where:
        parts.append(f"at {where}")
    parts.append(f"{type(error).__name__}: {first[:300]}")
    return "; ".join(parts)


def capture(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    *,
    strict: bool = False,
    dynamic_shapes: Any = None,
) -> Captured:
    """torch.export the model (inference IR, no decompositions) into a flat graph module;
    `dynamic_shapes` is torch.export's, and the placeholders keep their symbolic sizes."""
    kwargs = dict(kwargs or {})
    try:
        with torch.no_grad():
            program = torch.export.export(
                model, tuple(args), kwargs, dynamic_shapes=dynamic_shapes, strict=strict
            )
            program = program.run_decompositions({})
    except Exception as error:
        raise CaptureError(explain(model, error)) from error
    unlifted = program.module()
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in unlifted.graph.nodes:
        if node.op == "call_module" and str(node.target).startswith("_guards"):
            continue  # export's input check: the specs are checked when the program runs
        if node.op == "output":
            graph.output(tuple(env[n] for n in node.args[0]))  # flat tuple
            continue
        env[node] = graph.node_copy(node, lambda n: env[n])
    gm = fx.GraphModule(unlifted, graph)
    flat = pytree.tree_leaves((tuple(args), kwargs))
    return Captured(gm, flat, copy.deepcopy(unlifted.graph._codegen), symbolic_dims(gm))


def symbolic_dims(gm: fx.GraphModule) -> dict[int, tuple[int, ...]]:
    """Flat input position -> the dims whose size in the placeholder's value is a symbol."""
    dims: dict[int, tuple[int, ...]] = {}
    for position, node in enumerate(gm.graph.find_nodes(op="placeholder")):
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            found = tuple(
                d
                for d, s in enumerate(value.shape)
                if isinstance(s, torch.SymInt) and not s.node.expr.is_number
            )
            if found:
                dims[position] = found
    return dims
