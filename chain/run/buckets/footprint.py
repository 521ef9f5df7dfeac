"""What a bucket's compiled artefact keeps in device memory (a CUDA graph's pool, an
engine's workspace), measured around its build, for the `max_bucket_mb` bound."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def measured(inputs: Sequence[Any], build: Callable[[], T]) -> tuple[T, float | None]:
    """`build()` and the CUDA memory still allocated after it that was not before (MiB),
    on the device of the first CUDA input; None when no input is on CUDA (not measured:
    host memory of a CPU artefact is not counted)."""
    device = next((x.device for x in inputs if isinstance(x, torch.Tensor) and x.is_cuda), None)
    if device is None:
        return build(), None
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    out = build()
    torch.cuda.synchronize(device)
    return out, max(torch.cuda.memory_allocated(device) - before, 0) / 2**20
