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

from backends.inductor_config import check_mode, config_options, config_patches
from backends.registry import register_backend


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
