"""Median latency with warm-up, candidates interleaved so drift hits all of them alike."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch


class TimingError(Exception):
    """A candidate raised while being timed; `name` says which."""

    def __init__(self, name: str, exc: Exception) -> None:
        super().__init__(f"{name} raised while being timed: {exc}")
        self.name = name
        self.exc = exc


def _call(name: str, fn: Callable[..., Any], inputs: Sequence[Any]) -> None:
    try:
        fn(*inputs)
    except Exception as exc:
        raise TimingError(name, exc) from exc


def _sync_for(inputs: Sequence[Any]) -> Callable[[], None]:
    devices = {x.device for x in inputs if isinstance(x, torch.Tensor) and x.is_cuda}
    if not devices:
        return lambda: None
    return lambda: [torch.cuda.synchronize(d) for d in devices] and None


def median_ms(
    fns: Mapping[str, Callable[..., Any]],
    inputs: Sequence[Any],
    *,
    budget_s: float = 0.25,
    warmup: int = 2,
    min_repeats: int = 5,
    max_repeats: int = 100,
) -> dict[str, float]:
    """Median milliseconds per call of each fn on `inputs`, round-robin within a time budget."""
    sync = _sync_for(inputs)
    with torch.no_grad():
        for name, fn in fns.items():
            for _ in range(warmup):
                _call(name, fn, inputs)
        sync()
        samples: dict[str, list[float]] = {name: [] for name in fns}
        deadline = time.perf_counter() + budget_s
        for rep in range(max_repeats):
            for name, fn in fns.items():
                start = time.perf_counter()
                _call(name, fn, inputs)
                sync()
                samples[name].append(time.perf_counter() - start)
            if rep + 1 >= min_repeats and time.perf_counter() > deadline:
                break
    return {name: 1000 * statistics.median(s) for name, s in samples.items()}
