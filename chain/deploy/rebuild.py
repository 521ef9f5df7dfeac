"""A program's outputs rebuilt from the graph's flat tuple by a closure prepared once per
output spec: each node's registered unflatten function and context, and each leaf's index,
looked up at load, so a call pays only the constructors (`pytree.tree_unflatten` walks
and checks the spec at every call: the loaded program's cost around the runner for models
returning transformers `ModelOutput`s, issue 47). A `ModelOutput` node is built without
its constructor where `model_output.maker` shows that gives the same object."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

from torch.utils import _pytree as pytree

from chain.deploy.model_output import maker

Build = Callable[[Sequence[Any]], Any]


def _values(children: list[Build], leaves: list[int] | None) -> Build:
    """flat -> the children's values, as a tuple: one `itemgetter` when all are leaves."""
    if leaves is not None and len(leaves) > 1:
        return operator.itemgetter(*leaves)  # type: ignore[return-value]
    if leaves is not None and len(leaves) == 1:
        only = leaves[0]
        return lambda flat: (flat[only],)
    return lambda flat: tuple([c(flat) for c in children])


def _node(spec: pytree.TreeSpec, start: int) -> tuple[Build, int, int | None]:
    """The builder of `spec`'s subtree whose first leaf is flat[start], the next index, and
    the leaf's index when `spec` is a leaf."""
    if spec.is_leaf():
        return operator.itemgetter(start), start + 1, start
    children: list[Build] = []
    leaves: list[int] | None = []
    at = start
    for child in spec.children():
        build, at, leaf = _node(child, at)
        children.append(build)
        leaves = None if leaf is None or leaves is None else [*leaves, leaf]
    values = _values(children, leaves)
    if spec.type is tuple:
        return values, at, None  # `_values` gives a tuple
    if spec.type is list:
        return (lambda flat: list(values(flat))), at, None
    unflatten = pytree.SUPPORTED_NODES[spec.type].unflatten_fn
    context = spec.context
    make = maker(spec.type, context, unflatten) if isinstance(context, list) else None
    if make is not None and start == 0 and leaves == list(range(spec.num_leaves)):
        return make, at, None  # the root, its leaves all of flat, in order: flat itself
    if make is not None:
        return (lambda flat: make(values(flat))), at, None
    return (lambda flat: unflatten(list(values(flat)), context)), at, None


def rebuilder(spec: pytree.TreeSpec) -> Build:
    """flat -> the structure `spec` describes, equal to `pytree.tree_unflatten(flat, spec)`
    (same types, keys and values) for the `spec.num_leaves` values it was made for."""
    build, used, _ = _node(spec, 0)
    if used != spec.num_leaves:
        raise ValueError(f"spec has {spec.num_leaves} leaves, the builder read {used}")
    return build
