"""Markers `cuda`, `ort_cuda` and `tensorrt`, defined once: tests carrying them skip with
the reason."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import pytest
import torch

# Remembered decisions (chain.memory) stay off in the suite: a test must see a selection,
# not an earlier test's winner. tests/test_memory.py turns them on where it means to.
os.environ["CHAIN_MEMORY"] = "0"
# Nor do inductor winners build AOTInductor packages in the background (a second compile
# each): tests/test_inductor_package.py turns them on in the processes it starts.
os.environ["CHAIN_INDUCTOR_PACKAGE"] = "0"


def _cuda_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    return None


def _ort_cuda_reason() -> str | None:
    """Why ONNX Runtime cannot run on CUDA here: no device, or a build without the CUDA EP."""
    no_device = _cuda_reason()
    if no_device:
        return no_device
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        return (
            "this onnxruntime has no CUDAExecutionProvider "
            f"({', '.join(onnxruntime.get_available_providers())}): "
            "pip install 'backend-chain[gpu]'"
        )
    return None


def _tensorrt_reason() -> str | None:
    """The device first: without one, installing TensorRT cannot help."""
    no_device = _cuda_reason()
    if no_device:
        return no_device
    if importlib.util.find_spec("tensorrt") is None:
        return "tensorrt is not installed: pip install 'backend-chain[gpu]'"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reasons = {"cuda": _cuda_reason, "ort_cuda": _ort_cuda_reason, "tensorrt": _tensorrt_reason}
    cache: dict[str, str | None] = {}
    for item in items:
        for marker, probe in reasons.items():
            if item.get_closest_marker(marker) is not None:
                if marker not in cache:
                    cache[marker] = probe()
                if cache[marker]:
                    item.add_marker(pytest.mark.skip(reason=cache[marker]))


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    """Each test compiles from scratch: no graphs cached from an earlier test."""
    torch._dynamo.reset()


@pytest.fixture(params=["fast", "general"])
def guard_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Runs a test on each of the guard's two paths for a watched call: the fast closure
    (chain.run.watch.fast), which must then have been built for at least one winner, and the
    general path alone. Both must reach the same verdicts."""
    import chain.run.guard

    built: list[Any] = []
    real = chain.run.guard.fast_path

    def recorded(watch: Any, fn: Any) -> Any:
        fast = real(watch, fn) if request.param == "fast" else None
        built.append(fast)
        return fast

    monkeypatch.setattr(chain.run.guard, "fast_path", recorded)
    yield request.param
    if request.param == "fast":
        assert any(f is not None for f in built), "no winner took the fast path"
