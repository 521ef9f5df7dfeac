"""inductor: torch's own compiler through dynamo's entry; options pass through to it.

`mode` takes torch.compile's inductor modes (`torch._inductor.list_mode_options()`:
default, lite, reduce-overhead, max-autotune-no-cudagraphs, max-autotune); every other
option is an inductor config override and wins over the mode's settings. A mode that
turns on CUDA graphs (`triton.cudagraphs`) compiles through `inductor_graphed`, which
checks the preconditions, turns torch's silent skips into reasons and keeps outputs safe.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from backends.errors import InvalidOption
from backends.options import BadValue, Check, boolean, threads
from backends.registry import register_backend


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


@register_backend(
    "inductor",
    options={"mode": check_mode},
    vocabulary=config_options,
    vocabulary_doc="a name of torch._inductor.config (torch._inductor.list_options())",
)
def inductor(
    gm: fx.GraphModule, example_inputs: list[torch.Tensor], mode: str | None = None, **options: Any
) -> Callable[..., Any]:
    """Compile with TorchInductor; `mode` is an inductor mode, `options` config overrides."""
    from torch._inductor.compile_fx import compile_fx

    patches = config_patches(mode, options)
    if patches.get("triton.cudagraphs"):
        from backends.inductor_graphed import compile_graphed

        return compile_graphed(gm, example_inputs, patches)
    return compile_fx(gm, example_inputs, config_patches=patches or None)
