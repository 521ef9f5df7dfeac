"""torch.compile's `mode=` read as chain options, so `torch.compile(m, backend="chain",
mode="fastest")` means what a torch.compile user expects instead of being dropped.

torch.compile hands `mode` to any backend other than inductor as a keyword argument of the
backend call (torch's `_TorchCompileWrapper`), never "default", and never together with
`options=` (torch refuses both at once). It reaches the chain at the first graph, so a bad
mode is an `InvalidOption` at the first call, not at `torch.compile(...)`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from backends.errors import InvalidOption
from backends.options import did_you_mean

# torch.compile's mode -> the chain options it sets (the chain's own modes, then torch's)
TORCH_MODES: dict[str, dict[str, Any]] = {
    "default": {},
    "first": {"mode": "first"},
    "fastest": {"mode": "fastest"},
    "max-autotune": {"mode": "fastest"},
    "max-autotune-no-cudagraphs": {"mode": "fastest", "cuda_graphs": False},
    "reduce-overhead": {"cuda_graphs": True},
}


def options_for(mode: Any) -> dict[str, Any]:
    """The chain options torch.compile's `mode` stands for; InvalidOption naming the valid
    modes (and the likely intended one) for any other value."""
    if mode is None:
        return {}
    if not isinstance(mode, str) or mode not in TORCH_MODES:
        hint = did_you_mean(mode, list(TORCH_MODES)) if isinstance(mode, str) else ""
        raise InvalidOption(
            f"torch.compile(mode={mode!r}) is not a mode of the chain{hint}; valid: "
            f"{', '.join(repr(m) for m in TORCH_MODES)}"
        )
    return dict(TORCH_MODES[mode])


def merged(mode: Any, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """`options` with what `mode` sets; InvalidOption when the two disagree on a value."""
    from_mode = options_for(mode)
    given = dict(options or {})
    clash = sorted(k for k in from_mode if k in given and given[k] != from_mode[k])
    if clash:
        raise InvalidOption(
            f"torch.compile(mode={mode!r}) sets {', '.join(f'{k}={from_mode[k]!r}' for k in clash)}"
            f" but options say {', '.join(f'{k}={given[k]!r}' for k in clash)}"
        )
    return {**from_mode, **given}


def check_agrees(mode: Any, settings: Mapping[str, Any]) -> None:
    """torch.compile(backend=<a chain object>, mode=...): the chain was built with its
    options already, so `mode` must ask for what it has; InvalidOption otherwise (saying
    how to build the chain that mode asks for) rather than a mode silently dropped."""
    wanted = options_for(mode)
    clash = sorted(k for k, v in wanted.items() if settings.get(k) != v)
    if clash:
        asked = ", ".join(f"{k}={wanted[k]!r}" for k in clash)
        has = ", ".join(f"{k}={settings.get(k)!r}" for k in clash)
        raise InvalidOption(
            f"torch.compile(mode={mode!r}) asks for {asked}, but this chain was built with "
            f"{has}: build it with chain(..., {asked})"
        )


def check_call(kwargs: Mapping[str, Any], settings: Mapping[str, Any]) -> None:
    """What torch.compile passed to a chain object's call besides the graph: `mode` must
    agree with the chain (`check_agrees`); `options` are refused, since they belong to
    `chain(...)` and would otherwise be dropped without a word."""
    if kwargs.get("options"):
        raise InvalidOption(
            f"torch.compile(options={dict(kwargs['options'])!r}) with a chain object: give "
            "them to chain(...) (backend options as chain(..., options={backend: {...}}))"
        )
    check_agrees(kwargs.get("mode"), settings)
