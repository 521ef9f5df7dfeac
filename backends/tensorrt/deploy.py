"""TensorRT's export hooks: the engines the chain verified as payloads, and their loader.

Exporter: when TensorRT won the graph, each engine module of its compiled graph is one
part (no rebuild: the payloads are the engines the chain verified) and the PyTorch parts
around them stay PyTorch. Loader: checks that this process has the TensorRT version and
the GPU model that built the engine (engines do not move across either), then
deserializes it into an engine module.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from backends.common import payload
from backends.common.fx_utils import calls_of, record_calls
from backends.common.parts import ExportedParts, ExportRequest, Part, Runner, flat_outputs
from backends.tensorrt.runtime.compiled import CompiledGraph
from backends.tensorrt.runtime.engine_module import TensorRTEngineModule

NAME = "tensorrt"


logger = logging.getLogger(__name__)


def gpu_facts(device: torch.device) -> tuple[str, str]:
    """The GPU's name and compute capability (`"9.0"`), which an engine is tied to."""
    index = device.index if device.type == "cuda" and device.index is not None else 0
    major, minor = torch.cuda.get_device_capability(index)
    return torch.cuda.get_device_name(index), f"{major}.{minor}"


def export_parts(request: ExportRequest) -> ExportedParts | None:
    """The exporter hook: one part per engine of the winning compiled graph."""
    from backends.tensorrt.conversion.engine import tensorrt_version

    compiled = request.compiled
    if not isinstance(compiled, CompiledGraph):
        return None
    if request.dynamic_dims:  # fixed-size engines: the program's own export would fail
        logger.warning("TensorRT engines have fixed sizes: not exported with dynamic_shapes")
        return None
    gm = compiled.gm
    engines = {
        name: module
        for name, module in gm.named_children()
        if isinstance(module, TensorRTEngineModule)
    }
    profiled = sorted(name for name, module in engines.items() if module.profiles)
    if profiled:  # a payload carries neither the profiles nor the SymInt inputs' positions
        logger.warning(
            "TensorRT engines %s have optimization profiles (a graph with symbolic sizes): "
            "not exported as TensorRT parts",
            profiled,
        )
        return None
    calls = record_calls(gm, request.flat_inputs, calls_of(set(engines)))
    version = tensorrt_version()
    parts: dict[str, Part] = {}
    for name, module in engines.items():
        args, out = calls[name]
        outputs, _ = flat_outputs(out)
        gpu, capability = gpu_facts(args[0].device if args else torch.device("cuda"))
        header = payload.Header(
            backend=NAME,
            version=version,
            sha256=payload.digest(module.serialized),
            input_names=module.input_names,
            output_names=module.output_names,
            outputs=tuple(payload.TensorSpec.of(t) for t in outputs),
            device="cuda",
            gpu=gpu,
            compute_capability=capability,
        )
        parts[name] = Part(
            name=name,
            header=header,
            body=module.serialized,
            input_positions=tuple(range(len(args))),
            returns_tuple=module.returns_tuple,
            example_inputs=args,
            expected=tuple(outputs),  # the engine's own: its PyTorch block is not kept
        )
    return ExportedParts(gm, parts, f"export: {len(parts)} TensorRT engine(s)")


def check_tensorrt(
    header: payload.Header, installed: str | None, gpu: str | None, capability: str | None
) -> None:
    """Engines run only with the TensorRT version and the GPU model that built them."""
    if installed is None:
        raise payload.RuntimeMissing(
            f"this program has a TensorRT engine built with {header.describe()}, and tensorrt "
            f"is not installed: {payload.GPU_EXTRA}"
        )
    if gpu is None:
        raise payload.RuntimeMissing(
            f"this program has a TensorRT engine built with {header.describe()}, and there is "
            "no CUDA device here (torch.cuda.is_available() is False)"
        )
    if installed != header.version:
        raise payload.PayloadMismatch(
            f"TensorRT engine built with TensorRT {header.version}, this process has "
            f"{installed}: engines do not move across TensorRT versions; install "
            f"tensorrt=={header.version} or export again here"
        )
    if header.gpu is not None and (gpu != header.gpu or capability != header.compute_capability):
        raise payload.PayloadMismatch(
            f"TensorRT engine built on {header.gpu} (sm {header.compute_capability}), this "
            f"device is {gpu} (sm {capability}): export again on this GPU"
        )


def load_payload(header: payload.Header, body: bytes, device: torch.device) -> Runner:
    """The loader hook: a deserialized engine behind the engine module (GPU only)."""
    gpu = capability = None
    if torch.cuda.is_available():
        gpu, capability = gpu_facts(device)
    check_tensorrt(header, payload.installed_version("tensorrt"), gpu, capability)
    module = TensorRTEngineModule(body, header.input_names, header.output_names, True)
    module.load()  # deserialize now: a bad engine fails here, once, not mid-run

    def run(inputs: Sequence[Any]) -> list[torch.Tensor]:
        return list(module(*inputs))

    return run
