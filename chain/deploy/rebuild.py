"""A program's outputs rebuilt from the graph's flat tuple by a closure prepared once per
output spec: each node's registered unflatten function and context, and each leaf's index,
looked up at load, so a call pays only the constructors (`pytree.tree_unflatten` walks
and checks the spec at every call: the loaded program's cost around the runner for models
returning transformers `ModelOutput`s, issue 47)."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

from torch.utils import _pytree as pytree

Build = Callable[[Sequence[Any]], Any]


def _node(spec: pytree.TreeSpec, start: int) -> tuple[Build, int]:
    """The builder of `spec`'s subtree whose first leaf is flat[start], and the next index."""
    if spec.is_leaf():
        return operator.itemgetter(start), start + 1
    children: list[Build] = []
    at = start
    for child in spec.children():
        build, at = _node(child, at)
        children.append(build)
    if spec.type is tuple:
        return (lambda flat: tuple([c(flat) for c in children])), at
    if spec.type is list:
        return (lambda flat: [c(flat) for c in children]), at
    unflatten = pytree.SUPPORTED_NODES[spec.type].unflatten_fn
    context = spec.context
    return (lambda flat: unflatten([c(flat) for c in children], context)), at


def rebuilder(spec: pytree.TreeSpec) -> Build:
    """flat -> the structure `spec` describes, equal to `pytree.tree_unflatten(flat, spec)`
    (same types, keys and values) for the `spec.num_leaves` values it was made for."""
    build, used = _node(spec, 0)
    if used != spec.num_leaves:
        raise ValueError(f"spec has {spec.num_leaves} leaves, the builder read {used}")
    return build
