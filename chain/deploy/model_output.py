"""A transformers `ModelOutput` built without its constructor, for the loaded program's rebuild.

transformers unflattens a `ModelOutput` with `cls(**dict(zip(keys, values)))`: the
dataclass `__init__` runs the class's `__setattr__` per field (each reading
`dataclasses.fields`) and `__post_init__` re-checks the fields and sets the items again:
~50 us a call warm, ~0.1 ms after an idle gap (issue 47). What it leaves is simple: an
OrderedDict of the non-None fields in field order, and every field as an attribute. `maker`
builds that object directly (`OrderedDict.__setitem__` per key, the attributes in one
update), only for the shapes of input where the constructor does exactly that, and checks
at load that its object equals the constructor's (type, keys, items, attributes); where
anything differs it returns None and the caller keeps transformers' own unflatten.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch

Make = Callable[[Sequence[Any]], Any]

_Tensor = torch.Tensor
_RENAMED = ("past_key_values", "cache_params")  # ModelOutput renames these keys on set


def _model_output_class(unflatten: Any, cls: type) -> type | None:
    """transformers' `ModelOutput` base when `unflatten` is its own unflatten of `cls` and
    `cls` keeps the base's construction (no override of the methods the build skips)."""
    generic = sys.modules.get("transformers.utils.generic")
    base = getattr(generic, "ModelOutput", None)
    if base is None or not isinstance(unflatten, functools.partial):
        return None
    if unflatten.func is not getattr(generic, "_model_output_unflatten", None):
        return None
    if unflatten.args or unflatten.keywords != {"output_type": cls}:
        return None
    if not (isinstance(cls, type) and issubclass(cls, base) and dataclasses.is_dataclass(cls)):
        return None
    same = ("__post_init__", "__setattr__", "__setitem__", "__new__")
    if any(getattr(cls, name) is not getattr(base, name) for name in same):
        return None
    return base


def maker(cls: type, context: Sequence[Any], unflatten: Any) -> Make | None:
    """values (in `context`'s key order) -> the `cls` transformers' `unflatten` would build,
    without its constructor; None where the direct build is not known to be the same."""
    if _model_output_class(unflatten, cls) is None:
        return None
    fields = dataclasses.fields(cls)
    names = [f.name for f in fields]
    keys = list(context)
    if not keys or any(not isinstance(k, str) for k in keys):
        return None
    if any(not f.init for f in fields) or set(names) & set(_RENAMED):
        return None
    if keys != [n for n in names if n in keys]:  # unknown keys, or not in field order
        return None
    # a lone first field that is not a tensor is unpacked by __post_init__ as (key, value)
    # pairs: for it, the constructor's own path
    first_only = keys == names[:1]
    construct = functools.partial(unflatten, context=keys)
    make = _make(cls, tuple(keys), dict.fromkeys(names), first_only, construct)
    return make if _same_as_constructor(make, unflatten, keys) else None


def _make(
    cls: type,
    keys: tuple[str, ...],
    template: dict[str, None],
    first_only: bool,
    construct: Make,
) -> Make:
    new = cls.__new__
    setitem = OrderedDict.__setitem__
    set_dict, copy = object.__setattr__, dict.copy
    pairs = tuple(enumerate(keys))
    tensor = _Tensor

    def make(values: Sequence[Any]) -> Any:
        if first_only and type(values[0]) is not tensor:
            return construct(values)
        out = new(cls)
        for i, key in pairs:
            setitem(out, key, values[i])
        # every field, in field order, as the dataclass sets them: one new dict set as the
        # instance's (~20 us less after an idle gap than reading `__dict__` and updating it)
        attrs = copy(template)
        attrs.update(zip(keys, values, strict=True))
        set_dict(out, "__dict__", attrs)
        return out

    return make


def _same_as_constructor(make: Make, unflatten: Any, keys: list[str]) -> bool:
    """`make` and the constructor give equal objects on stand-in tensors (checked once)."""
    values = [torch.empty(0) for _ in keys]
    got, want = make(values), unflatten(values, keys)
    return (
        type(got) is type(want)
        and list(got.keys()) == list(want.keys())
        and all(a is b for a, b in zip(got.values(), want.values(), strict=True))
        and list(vars(got)) == list(vars(want))
        and all(vars(got)[k] is vars(want)[k] for k in vars(want))
    )
