"""Version counters that exist: inference tensors keep none.

Under `torch.inference_mode()` every tensor made in the call (inputs, and the 0-d tensors
dynamo lifts Python floats to under `dynamic=True`) is an inference tensor, and reading
its `_version` raises. Such a tensor reads as `NO_VERSION`: a write to it cannot be seen
by its counter, only by comparing values (the run-time checks do so at re-verification).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

NO_VERSION = -1


def version(t: torch.Tensor) -> int:
    """`t._version`, or NO_VERSION for an inference tensor."""
    return NO_VERSION if t.is_inference() else t._version


def versions(args: Sequence[Any], positions: Sequence[int]) -> list[int]:
    """The version counters of `args` at `positions` (NO_VERSION where there is none)."""
    return [NO_VERSION if (t := args[i]).is_inference() else t._version for i in positions]
