"""inductor's options: its config names (type-checked where they are bools or bounded), its
modes, and the config overrides a mode and the user's options make. Shared by `inductor` and
its CUDA graphs variant (`graphed`); imports nothing of inductor's other modules."""

from __future__ import annotations

from typing import Any

from backends.errors import InvalidOption
from backends.options import BadValue, Check, boolean, threads


def config_options() -> dict[str, Check | None]:
    """Every `torch._inductor.config` name (dotted for nested ones), bool ones type-checked.

    Imported only when options are checked: importing inductor costs about a second.
    """
    import torch._inductor.config as config

    return {
        name: _BOUNDED.get(name, boolean if isinstance(default, bool) else None)
        for name, default in config.get_config_copy().items()
    }


# inductor's numeric settings whose out-of-range values exhaust the machine
_BOUNDED: dict[str, Check] = {"compile_threads": threads(), "cpp.threads": threads(auto=-1)}


def check_mode(value: Any) -> Any:
    """One of inductor's modes (`torch._inductor.list_mode_options()`), or None."""
    if value is None:
        return None
    from torch._inductor import list_mode_options

    modes = list(list_mode_options())
    if value not in modes:
        raise BadValue(f"one of {', '.join(map(repr, modes))}")
    return value


def config_patches(mode: str | None, options: dict[str, Any]) -> dict[str, Any]:
    """Inductor config overrides: the mode's settings, then the user's options over them."""
    if mode is None:
        return dict(options)
    from torch._inductor import list_mode_options

    modes = list_mode_options()
    if mode not in modes:
        raise InvalidOption(f"inductor mode {mode!r}; valid: {', '.join(modes)}")
    return {**list_mode_options(mode), **options}
