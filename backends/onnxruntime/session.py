"""ONNX Runtime sessions: execution providers from what is installed, options, load errors."""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from backends.errors import Unsupported

Provider = str | tuple[str, dict[str, Any]]
log = logging.getLogger(__name__)


def available() -> str | None:
    """None when onnxruntime imports, else how to install it."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError as error:
        return (
            f"onnxruntime is not installed ({error}): "
            "pip install 'backend-chain[cpu]' (or [gpu] for onnxruntime-gpu)"
        )
    return None


def default_providers(device: torch.device) -> list[Provider]:
    """TensorRT EP (when it loads), CUDA EP for CUDA inputs (when installed); CPU last."""
    import onnxruntime as ort

    installed = set(ort.get_available_providers())
    chosen: list[Provider] = []
    if device.type == "cuda":
        if "CUDAExecutionProvider" not in installed:
            raise Unsupported(
                "inputs are on CUDA but this onnxruntime has no CUDAExecutionProvider: "
                "pip install 'backend-chain[gpu]'"
            )
        stream = torch.cuda.current_stream(device).cuda_stream
        on_torch_stream = {
            "device_id": str(device.index or 0),
            "has_user_compute_stream": "1",
            "user_compute_stream": str(stream),
        }
        if "TensorrtExecutionProvider" in installed and tensorrt_ep_loads() is None:
            chosen.append(("TensorrtExecutionProvider", dict(on_torch_stream)))
        chosen.append(("CUDAExecutionProvider", on_torch_stream))
    elif device.type != "cpu":
        raise Unsupported(f"inputs on {device.type}: the ONNX Runtime backend takes cpu or cuda")
    chosen.append("CPUExecutionProvider")
    return chosen


@functools.cache
def tensorrt_ep_loads() -> str | None:
    """None when ORT's TensorRT EP library loads here, else why not (probed once, quietly).

    onnxruntime-gpu lists `TensorrtExecutionProvider` as available whether or not the
    TensorRT libraries are installed; choosing it without them prints a multi-line
    "EP Error ... libnvinfer.so: cannot open shared object file" block per session. Loading
    the provider library ourselves (it links libnvinfer) tells without the noise.
    """
    import onnxruntime as ort

    capi = Path(ort.__file__).parent / "capi"
    found = sorted(capi.glob("*onnxruntime_providers_tensorrt*"))
    if not found:
        return f"no TensorRT EP library in {capi}"
    try:
        ctypes.CDLL(str(found[0]))
    except OSError as error:
        log.info("not using ONNX Runtime's TensorRT EP: %s", error)
        return f"TensorRT EP cannot load: {error}"
    return None


def create_session(model: bytes, options: Any, providers: Sequence[Provider]) -> Any:
    """An InferenceSession; ORT's refusals (no kernel, invalid graph) become Unsupported."""
    import onnxruntime as ort
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    refusals = (state.NotImplemented, state.InvalidGraph, state.InvalidArgument)
    try:
        return ort.InferenceSession(model, sess_options=options, providers=list(providers))
    except refusals as error:
        text = str(error)
        line = next((s for s in text.splitlines() if s.strip()), type(error).__name__)
        raise Unsupported(f"onnxruntime refused the model: {line[:200]}", detail=text) from error


def provider_names(providers: Sequence[Provider]) -> list[str]:
    """Just the provider names, for the report."""
    return [p if isinstance(p, str) else p[0] for p in providers]


def user_stream(providers: Sequence[Provider]) -> int | None:
    """The CUDA stream (as an int) the CUDA EP was told to run on, if any."""
    for provider in providers:
        if isinstance(provider, tuple) and provider[0] == "CUDAExecutionProvider":
            stream = provider[1].get("user_compute_stream")
            return int(stream) if stream is not None else None
    return None
