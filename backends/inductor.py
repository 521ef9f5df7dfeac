"""inductor: torch's own compiler through dynamo's entry; options pass through to it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from backends.registry import register_backend


@register_backend("inductor", options=None)
def inductor(
    gm: fx.GraphModule, example_inputs: list[torch.Tensor], **options: Any
) -> Callable[..., Any]:
    """Compile with TorchInductor; `options` are inductor config overrides."""
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, example_inputs, config_patches=options or None)
