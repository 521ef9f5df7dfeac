"""Runners for payloads at load time: checks of what built them, then a session or an engine.

A runner is built once per payload (see `ops.py` for the cache) and called with the op's
inputs; it returns a list of tensors. Checks come first and raise `PayloadMismatch` or
`RuntimeMissing` with one line naming what to do, never a crash deep in a runtime.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from typing import Any

import torch

from chain.deploy.payload import Header, PayloadError

Runner = Callable[[Sequence[torch.Tensor]], list[torch.Tensor]]

GPU_EXTRA = "pip install 'backend-chain[gpu]'"
CPU_EXTRA = "pip install 'backend-chain[cpu]'"


class RuntimeMissing(PayloadError):
    """The payload's runtime (tensorrt, onnxruntime, a CUDA device) is not here."""


class PayloadMismatch(PayloadError):
    """The payload was built by a runtime this process cannot honour (version, GPU)."""


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split("."):
        digits = "".join(c for c in piece if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def check_onnxruntime(header: Header, installed: str | None) -> None:
    """ORT must be present and not older (major.minor) than the one that verified the model."""
    if installed is None:
        raise RuntimeMissing(
            f"this program has an ONNX model built with {header.describe()}, and onnxruntime "
            f"is not installed: {CPU_EXTRA} (or {GPU_EXTRA} on GPU machines)"
        )
    if _version_tuple(installed)[:2] < _version_tuple(header.version)[:2]:
        raise PayloadMismatch(
            f"ONNX model built and verified with {header.describe()}, this process has "
            f"onnxruntime {installed}, which may not run its opset: pip install -U onnxruntime "
            "(or export again with this onnxruntime)"
        )


def check_tensorrt(
    header: Header, installed: str | None, gpu: str | None, capability: str | None
) -> None:
    """Engines run only with the TensorRT version and the GPU model that built them."""
    if installed is None:
        raise RuntimeMissing(
            f"this program has a TensorRT engine built with {header.describe()}, and tensorrt "
            f"is not installed: {GPU_EXTRA}"
        )
    if gpu is None:
        raise RuntimeMissing(
            f"this program has a TensorRT engine built with {header.describe()}, and there is "
            "no CUDA device here (torch.cuda.is_available() is False)"
        )
    if installed != header.version:
        raise PayloadMismatch(
            f"TensorRT engine built with TensorRT {header.version}, this process has "
            f"{installed}: engines do not move across TensorRT versions; install "
            f"tensorrt=={header.version} or export again here"
        )
    if header.gpu is not None and (gpu != header.gpu or capability != header.compute_capability):
        raise PayloadMismatch(
            f"TensorRT engine built on {header.gpu} (sm {header.compute_capability}), this "
            f"device is {gpu} (sm {capability}): export again on this GPU"
        )


def installed_version(package: str) -> str | None:
    """The version of an importable package, or None when it is not installed."""
    if importlib.util.find_spec(package) is None:
        return None
    module = importlib.import_module(package)
    return str(getattr(module, "__version__", "unknown"))


def onnxruntime_runner(header: Header, body: bytes, device: torch.device) -> Runner:
    """An ORT session on `body` behind the ORT backend's zero-copy runner."""
    check_onnxruntime(header, installed_version("onnxruntime"))
    from backends.errors import Unsupported
    from backends.onnxruntime import OnnxGraph, OrtRunner
    from backends.onnxruntime.runtime import Compiled
    from backends.onnxruntime.runtime import OutputSpec as OrtOutputSpec
    from backends.onnxruntime.session import create_session, default_providers, session_options

    n = len(header.input_names)
    graph = OnnxGraph(
        model=body,
        input_names=header.input_names,
        output_names=header.output_names,
        input_positions=tuple(range(n)),
        frozen=(),
        derived=(),
        scalars={},
        dynamic_dims={},
        opset=int(header.opset or 0),
        num_initializers=0,
    )
    try:
        session = create_session(body, session_options(), default_providers(device))
    except Unsupported as error:
        raise PayloadMismatch(
            f"onnxruntime {installed_version('onnxruntime')} cannot load the ONNX model built "
            f"with {header.describe()}: {error.reason}"
        ) from error
    specs = [OrtOutputSpec(o.shape, o.torch_dtype) for o in header.outputs]
    runner = OrtRunner(
        Compiled(graph, session, ()),
        device=device,
        outputs=specs,
        single_output=False,
        rebuild=None,
    )

    def run(inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return list(runner(*[t.contiguous() for t in inputs]))

    return run


def tensorrt_runner(header: Header, body: bytes, device: torch.device) -> Runner:
    """A deserialized engine behind the TensorRT branch's engine module (GPU only)."""
    gpu = capability = None
    if torch.cuda.is_available():
        index = device.index if device.type == "cuda" and device.index is not None else 0
        gpu = torch.cuda.get_device_name(index)
        major, minor = torch.cuda.get_device_capability(index)
        capability = f"{major}.{minor}"
    check_tensorrt(header, installed_version("tensorrt"), gpu, capability)
    from backends.tensorrt.runtime.engine_module import TensorRTEngineModule

    module = TensorRTEngineModule(body, header.input_names, header.output_names, True)
    module._load()  # deserialize now: a bad engine fails here, once, not mid-run

    def run(inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return list(module(*inputs))

    return run


RUNTIMES: dict[str, Callable[[Header, bytes, torch.device], Runner]] = {
    "onnxruntime": onnxruntime_runner,
    "tensorrt": tensorrt_runner,
}


def build_runner(header: Header, body: bytes, device: torch.device) -> Any:
    """The runner for a payload's backend."""
    return RUNTIMES[header.backend](header, body, device)
