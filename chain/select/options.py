"""chain()'s options, checked when the chain is built: one table entry (a value check) each.

A bad name or value is an `InvalidOption` at `chain(...)` time that names the option,
what was given, what is valid and, for a near miss, the likely intended name, rather
than a TypeError at the first call or a compile error found only in the report.
Backend options (`options={"onnxruntime": {...}}`) are checked against what each backend
declares in the registry (`backends.options`).

To add a chain option: a keyword parameter of `Chain.__init__` and its entry in
`CHAIN_OPTIONS` (a check from `backends.options`, or your own `(value) -> value`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import torch

from backends.errors import InvalidOption
from backends.options import (
    BadValue,
    Check,
    boolean,
    check_options,
    did_you_mean,
    integer,
    number,
    one_of,
    optional,
)
from backends.registry import Backend
from chain.memory.stores import check_store

MODES = ("first", "fastest")

_FLOAT_DTYPES = {
    name: dtype
    for name in ("float16", "bfloat16", "float32", "float64", "half", "float", "double")
    if isinstance(dtype := getattr(torch, name, None), torch.dtype)
}


def _dtype(key: Any) -> torch.dtype:
    """A torch.dtype, or its name ("float16", "torch.float16")."""
    if isinstance(key, torch.dtype):
        return key
    name = key.removeprefix("torch.") if isinstance(key, str) else None
    if name is not None and isinstance(getattr(torch, name, None), torch.dtype):
        return getattr(torch, name)
    hint = did_you_mean(name, list(_FLOAT_DTYPES)) if name is not None else ""
    raise BadValue(
        f"a dict keyed by torch.dtype or a dtype name (float16, bfloat16, float32, float64); "
        f"{key!r} is neither{hint}"
    )


def tolerances(value: Any) -> dict[torch.dtype, tuple[float, float]]:
    """{dtype or dtype name: (rtol, atol)} -> {torch.dtype: (rtol, atol)}, names resolved."""
    if not isinstance(value, Mapping):
        raise BadValue("a dict {dtype: (rtol, atol)}")
    out: dict[torch.dtype, tuple[float, float]] = {}
    for key, tol in value.items():
        dtype = _dtype(key)
        try:
            rtol, atol = tol
            out[dtype] = (float(RTOL(rtol)), float(ATOL(atol)))
        except (TypeError, ValueError):
            raise BadValue(
                f"(rtol, atol) pairs: rtol from 0 to 1, atol from 0 to {MAX_ATOL:g}; "
                f"{key!r}: {tol!r} is not one"
            ) from None
    return out


MAX_ATOL = 1e6
# rtol above 1 accepts an answer twice the right one: a typo (1e3 for 1e-3), never a setting
RTOL, ATOL = number(low=0, high=1), number(low=0, high=MAX_ATOL)


def path(value: Any) -> Any:
    """A file path: str or os.PathLike, not empty."""
    if not isinstance(value, str | os.PathLike) or not os.fspath(value):
        raise BadValue("a non-empty path (str or os.PathLike)")
    return value


def backend_options(value: Any) -> dict[str, dict[str, Any]]:
    """{backend name: {option: value}}: the shape here; names and values per backend later."""
    if not isinstance(value, Mapping):
        raise BadValue("a dict {backend name: {option: value}}")
    for key, opts in value.items():
        if not isinstance(opts, Mapping):
            raise BadValue(
                f"a dict {{backend name: {{option: value}}}}; options[{key!r}] is a "
                f"{type(opts).__name__}, not a dict of {key}'s options"
            )
    return {key: dict(opts) for key, opts in value.items()}


def cuda_graphs(value: Any) -> str | bool:
    """The `cuda_graphs` stage setting: "auto", True or False (not 1, not "yes")."""
    if value is True or value is False or value == "auto":
        return value
    raise BadValue("'auto', True or False")


def challengers(value: Any) -> str | tuple[Any, ...]:
    """`challengers`: "auto", or backends (names or callables) raced at run time."""
    if value == "auto":
        return value
    if value is None:
        return ()
    if isinstance(value, str) or callable(value):
        return (value,)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) or callable(v) for v in value):
        return tuple(value)
    raise BadValue("'auto', a backend name or callable, or a list of them")


CHAIN_OPTIONS: dict[str, Check] = {
    "mode": one_of(*MODES),
    "verify": boolean,
    "measure": boolean,
    "strict": boolean,
    "eager_floor": boolean,
    "cuda_graphs": cuda_graphs,
    "options": optional(backend_options),
    "report_path": optional(path),
    "min_speedup": optional(number(above=0, high=1000)),
    "compile_timeout_s": optional(number(above=0, high=86400)),  # a day
    "max_retries": integer(low=0, high=10),
    "measure_budget_s": number(low=0, high=3600),  # an hour
    "tolerances": optional(tolerances),
    "watch": boolean,
    "reverify_rate": number(low=0, high=1),
    "memory": optional(boolean),
    "store": optional(check_store),
    "bucket_after": optional(integer(low=1, high=1_000_000)),  # None: no buckets
    "max_buckets": integer(low=1, high=1024),
    "max_bucket_mb": optional(number(above=0, high=2**20)),  # MiB of serving buckets; a TiB
    "max_artefact_mb": optional(number(low=0, high=2**20)),  # a TiB
    "challengers": challengers,
    "regions": boolean,
}


# Chain.__init__'s defaults
DEFAULTS = {"mode": "first", "measure": True, "min_speedup": None, "regions": False}
# (options contradict each other when this holds, what to say): each is valid alone
CONFLICTS: tuple[tuple[Callable[[Mapping[str, Any]], bool], str], ...] = (
    (
        lambda v: v["mode"] == "fastest" and not v["measure"],
        "mode='fastest' needs measure=True: the winner is chosen by latency",
    ),
    (
        lambda v: v["min_speedup"] is not None and not v["measure"],
        "min_speedup needs measure=True: a speedup is known only when timed",
    ),
    (
        lambda v: v["regions"] and v["mode"] != "fastest",
        "regions=True needs mode='fastest': regions are chosen by latency",
    ),
)


def check_conflicts(values: Mapping[str, Any]) -> None:
    """InvalidOption for options that contradict each other (`measure=False,
    mode="fastest"`): each is valid alone, so no one table entry can see it."""
    given = {**DEFAULTS, **values}
    for holds, message in CONFLICTS:
        if holds(given):
            raise InvalidOption(f"chain(): {message}")


def check_chain_options(values: Mapping[str, Any]) -> dict[str, Any]:
    """chain()'s keyword options, checked and normalized; InvalidOption for the first bad
    one, or for two that contradict each other (`check_conflicts`)."""
    checked = check_options("chain()", values, CHAIN_OPTIONS)
    check_conflicts(checked)
    return checked


def check_backend_options(
    backends: Sequence[Backend], options: Mapping[str, Mapping[str, Any]] | None
) -> dict[str, dict[str, Any]]:
    """Per-backend options, each key a backend of the chain, each checked by its backend."""
    by_name = {b.name: b for b in backends}
    out: dict[str, dict[str, Any]] = {}
    for key, opts in (options or {}).items():
        if key not in by_name:
            raise InvalidOption(
                f"options for {key!r}, which is not in this chain"
                f"{did_you_mean(str(key), by_name)}; valid keys: {', '.join(by_name)}"
            )
        out[key] = by_name[key].check_options(opts)
    return out


Init = TypeVar("Init", bound=Callable[..., None])


def checked(init: Init) -> Init:
    """Decorate `Chain.__init__`: its keyword options reach it checked and normalized."""

    @functools.wraps(init)
    def wrapper(self: Any, *backends: Any, **kwargs: Any) -> None:
        init(self, *backends, **check_chain_options(kwargs))

    return wrapper  # type: ignore[return-value]
