"""eager: run the graph module as it is. Always available; the usual last resort.

Its CUDA graphs variant is the `cudagraphs` backend: eager's kernels, replayed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from backends.cudagraphs import cudagraphs
from backends.registry import register_backend


@register_backend("eager", graphed=cudagraphs.compiler)
def eager(gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
    """Run the FX graph as PyTorch would, op by op."""
    return gm.forward
