"""inductor: torch's own compiler through dynamo's entry; options are inductor config overrides."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from backends.options import Check, boolean
from backends.registry import register_backend


def config_options() -> dict[str, Check | None]:
    """Every `torch._inductor.config` name (dotted for nested ones), bool ones type-checked.

    Imported only when options are checked: importing inductor costs about a second.
    """
    import torch._inductor.config as config

    return {
        name: boolean if isinstance(default, bool) else None
        for name, default in config.get_config_copy().items()
    }


@register_backend(
    "inductor",
    options=(),
    vocabulary=config_options,
    vocabulary_doc="a name of torch._inductor.config (torch._inductor.list_options())",
)
def inductor(
    gm: fx.GraphModule, example_inputs: list[torch.Tensor], **options: Any
) -> Callable[..., Any]:
    """Compile with TorchInductor; `options` are inductor config overrides."""
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, example_inputs, config_patches=options or None)
