"""Option checks: value checks a backend (or the chain) declares per option, and "did you mean".

A check is a callable `(value) -> value`: it returns the value to use (possibly normalized,
e.g. a dtype name turned into a `torch.dtype`) or raises `BadValue` saying what it expects.
`check_options` turns the first bad name or value into an `InvalidOption` whose message
names the option, the valid choices and, for a near miss, the likely intended one
(`difflib.get_close_matches`, as `argparse` does for subcommands since Python 3.12).

Declaring a checked option is one table entry: `{"level": one_of("low", "high")}`.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable, Collection, Mapping
from typing import Any

from backends.errors import InvalidOption

Check = Callable[[Any], Any]


class BadValue(ValueError):
    """A value a check refuses; the message says what is expected, e.g. "an int >= 0"."""

    def __init__(self, expected: str, suggestion: str | None = None) -> None:
        super().__init__(expected)
        self.expected = expected
        self.suggestion = suggestion


def did_you_mean(name: str, valid: Collection[str]) -> str:
    """ " (did you mean 'x'?)" for a near miss among `valid`, else "". Case is ignored:
    "ONNXRuntime" is a near miss of "onnxruntime"."""
    by_lower = {v.lower(): v for v in valid}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1)
    return f" (did you mean {by_lower[close[0]]!r}?)" if close else ""


def anything(value: Any) -> Any:
    """No check: for options whose values the backend checks itself."""
    return value


def boolean(value: Any) -> bool:
    """True or False (not 1, not "yes")."""
    if not isinstance(value, bool):
        raise BadValue("True or False")
    return value


def one_of(*choices: str) -> Check:
    """One of `choices` (strings), with a suggestion for a near miss."""

    def check(value: Any) -> str:
        if value not in choices:
            hint = did_you_mean(value, choices) if isinstance(value, str) else ""
            raise BadValue(f"one of {', '.join(map(repr, choices))}", hint or None)
        return value

    return check


def _number_check(kind: str, low: float | None, above: float | None, high: float | None) -> Check:
    """Shared body of `number` and `integer`: the type first, then the bounds."""
    types: tuple[type, ...] = (int,) if kind == "an int" else (int, float)
    if kind == "a number" and high is None:
        kind = "a finite number"  # Infinity is never a setting
    bounds = [f">= {low}"] if low is not None else [f"> {above}"] if above is not None else []
    bounds += [f"<= {high}"] if high is not None else []
    expected = f"{kind} {' and '.join(bounds)}".strip()

    def check(value: Any) -> Any:
        if not isinstance(value, types) or isinstance(value, bool) or not math.isfinite(value):
            raise BadValue(expected)  # NaN and Infinity included
        too_low = (low is not None and value < low) or (above is not None and value <= above)
        if too_low or (high is not None and value > high):
            raise BadValue(expected)
        return value

    return check


def number(
    *, low: float | None = None, above: float | None = None, high: float | None = None
) -> Check:
    """An int or float (not a bool, not a string, not NaN) within the bounds given."""
    return _number_check("a number", low, above, high)


def integer(*, low: int | None = None, above: int | None = None, high: int | None = None) -> Check:
    """An int (not a bool) within the bounds given."""
    return _number_check("an int", low, above, high)


THREADS_PER_CORE = 4  # more threads than this only thrash (and each costs memory)


def threads(*, auto: int | None = None) -> Check:
    """A thread count from 1 to THREADS_PER_CORE x the machine's cores, or `auto` (the
    library's own "choose for me" value, e.g. -1), so that a typo cannot exhaust memory."""

    def check(value: Any) -> int:
        cores = os.cpu_count() or 1
        limit = THREADS_PER_CORE * cores
        expected = f"an int >= 1 and <= {limit} ({THREADS_PER_CORE}x the {cores} cores)"
        if auto is not None:
            expected = f"{auto} (automatic) or {expected}"
        if not isinstance(value, int) or isinstance(value, bool):
            raise BadValue(expected)
        if value != auto and not 1 <= value <= limit:
            raise BadValue(expected)
        return value

    return check


def optional(check: Check) -> Check:
    """None, or what `check` accepts."""

    def optional_check(value: Any) -> Any:
        if value is None:
            return None
        try:
            return check(value)
        except BadValue as e:
            raise BadValue(f"None or {e.expected}", e.suggestion) from None

    return optional_check


def bad_value(owner: str, name: str, value: Any, error: BadValue) -> InvalidOption:
    """The InvalidOption for a refused value: who, which option, what was given, what is valid."""
    hint = error.suggestion or ""
    return InvalidOption(
        f"{owner} option {name}={value!r} ({type(value).__name__}): expected {error.expected}{hint}"
    )


def check_options(
    owner: str,
    options: Mapping[str, Any],
    checks: Mapping[str, Check | None],
    valid: str | None = None,
) -> dict[str, Any]:
    """Each option's checked value; InvalidOption for an unknown name or a refused value.

    `owner` names whose options these are in messages ("backend 'onnxruntime'", "chain()");
    `valid` replaces the list of valid names where it would be too long to read.
    """
    out: dict[str, Any] = {}
    for name, value in options.items():
        if name not in checks:
            valid = valid or ", ".join(sorted(checks)) or "none"
            raise InvalidOption(
                f"{owner} does not accept option {name!r}{did_you_mean(str(name), checks)}; "
                f"valid: {valid}"
            )
        check = checks[name] or anything
        try:
            out[name] = check(value)
        except BadValue as e:
            raise bad_value(owner, name, value, e) from None
    return out
