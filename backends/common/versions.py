"""Version counters that exist: inference tensors keep none.

Under `torch.inference_mode()` every tensor made in the call (inputs, and the 0-d tensors
dynamo lifts Python floats to under `dynamic=True`) is an inference tensor, and reading
its `_version` raises. Such a tensor reads as `NO_VERSION`: a write to it cannot be seen
by its counter, only by comparing values (the run-time checks do so at re-verification).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch

NO_VERSION = -1


def version(t: torch.Tensor) -> int:
    """`t._version`, or NO_VERSION for an inference tensor."""
    return NO_VERSION if t.is_inference() else t._version


def versions(args: Sequence[Any], positions: Sequence[int]) -> list[int]:
    """The version counters of `args` at `positions` (NO_VERSION where there is none)."""
    return [NO_VERSION if (t := args[i]).is_inference() else t._version for i in positions]


_version = torch._C.TensorBase._version.__get__  # the C getter, mapped over many tensors


def reader(positions: Sequence[int]) -> Callable[[Sequence[Any]], list[int]]:
    """`versions(args, positions)` as one C-level map per call: a launch-bound graph's call
    reads its activations' counters twice. An inference tensor's read raises; from then on
    (under inference_mode every call has them) each tensor is asked first, as `versions`."""
    if not positions:
        return lambda args: []
    get = operator.itemgetter(*positions)
    single = len(positions) == 1
    inference = [False]

    def read(args: Sequence[Any]) -> list[int]:
        if not inference[0]:
            try:
                return [_version(get(args))] if single else list(map(_version, get(args)))
            except RuntimeError:  # "Inference tensors do not track version counter"
                inference[0] = True
        return versions(args, positions)

    return read
