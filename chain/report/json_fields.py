"""Typed reads of fields from a report file, which may be hostile: each refuses a wrong
type with a TypeError that names the field and shows the value shortened."""

from __future__ import annotations

import json
import math
import reprlib
from typing import Any

_short = reprlib.Repr()
_short.maxstring = _short.maxother = 60
_short.maxlist = _short.maxdict = 4
_short.maxlevel = 2


NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def standard(value: Any) -> Any:
    """`value` with every NaN or infinite float, at any depth, as the string "NaN",
    "Infinity" or "-Infinity": bare NaN / Infinity are not JSON (strict readers refuse them)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, dict):
        return {k: standard(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [standard(v) for v in value]
    return value


def dumps(data: Any, **kwargs: Any) -> str:
    """Standard JSON of `data` (non-finite floats as strings, `standard`); kwargs as
    `json.dumps` takes them."""
    return json.dumps(standard(data), allow_nan=False, **kwargs)


def short(value: Any) -> str:
    """`repr(value)`, cut to a few dozen characters: messages stay one readable line."""
    return _short.repr(value)


def _refuse(value: Any, what: str, expected: str) -> TypeError:
    return TypeError(f"{what} should be {expected}, got {short(value)}")


def integer(value: Any, what: str) -> int:
    """An int (not a bool, not a float such as NaN or Infinity)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise _refuse(value, what, "an integer")


def optional_integer(value: Any, what: str) -> int | None:
    return None if value is None else integer(value, what)


def text(value: Any, what: str) -> str:
    if isinstance(value, str):
        return value
    raise _refuse(value, what, "a string")


def optional_text(value: Any, what: str) -> str | None:
    return None if value is None else text(value, what)


def texts(value: Any, what: str) -> tuple[str, ...]:
    """A list of strings."""
    if not isinstance(value, list):
        raise _refuse(value, what, "a list of strings")
    return tuple(text(v, f"{what}[{i}]") for i, v in enumerate(value))


def mapping(value: Any, what: str) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    raise _refuse(value, what, "an object")


def array(value: Any, what: str) -> list[Any]:
    if isinstance(value, list):
        return value
    raise _refuse(value, what, "a list")


def flag(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    raise _refuse(value, what, "true or false")


def deeper_than(data: Any, limit: int) -> bool:
    """Whether lists and objects nest more than `limit` deep (walked without recursion)."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > limit:
                return True
            items = value.values() if isinstance(value, dict) else value
            stack.extend((v, depth + 1) for v in items)
    return False
