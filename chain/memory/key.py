"""The decision key: what determines a graph's outcome, hashed into one name.

Four parts: the graph (its structural hash), its inputs (shapes, dtypes, devices, which
sizes are symbolic), the chain (backends, mode, options) and the environment (versions of
torch, backend-chain and the backends' packages; the device, or the CPU and thread count).
Any change of any part is a different key, so a decision is never reused where it was
not made.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import platform
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import fx

from chain.report import graphinfo

FORMAT = 1  # bump when the key's ingredients change meaning

# packages whose version can change a backend's outcome (absent ones count as absent)
PACKAGES = (
    "torch",
    "backend-chain",
    "onnx",
    "onnxscript",
    "onnxruntime",
    "onnxruntime-gpu",
    "tensorrt",
    "triton",
)


def _version(package: str) -> str | None:
    """The installed version of `package`, None when it is not installed."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def _cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what `platform` says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:  # not Linux: platform's answer
        lines = []
    for line in lines:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


@functools.cache
def _packages() -> dict[str, str | None]:
    return {p: _version(p) for p in PACKAGES} | {"python": sys.version.split()[0]}


def _device(device: str) -> dict[str, Any]:
    """What a device contributes: a GPU's name and capability, or the CPU and its threads."""
    if device.startswith("cuda") and torch.cuda.is_available():
        index = torch.device(device).index or 0
        return {
            "device": device,
            "name": torch.cuda.get_device_name(index),
            "capability": list(torch.cuda.get_device_capability(index)),
        }
    return {"device": device, "cpu": _cpu_model(), "threads": torch.get_num_threads()}


def environment(devices: Sequence[str]) -> dict[str, Any]:
    """The environment part of the key: package versions and the devices the inputs are on."""
    return {"packages": _packages(), "devices": [_device(d) for d in sorted(set(devices))]}


def _size(d: Any) -> int | str:
    """A size as the key holds it: a number, or a symbol's text (a SymInt dynamo's guards
    reduced to a constant is that number)."""
    if isinstance(d, int):
        return d
    expr = getattr(getattr(d, "node", None), "expr", None)
    if expr is not None and not expr.free_symbols:
        return int(expr)
    return str(d)


def _inputs(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> list[dict[str, Any]]:
    """Input specs; a symbolic size shows as its symbol (its name says which sizes are equal),
    never as this call's value: dynamo's example tensors are real, at the first call's
    sizes, and its traced placeholders say which of those sizes are symbolic."""
    specs = graphinfo.input_specs(example_inputs)
    traced = [n.meta.get("example_value") for n in gm.graph.find_nodes(op="placeholder")]
    for i, (spec, value) in enumerate(zip(specs, example_inputs, strict=True)):
        seen = traced[i] if i < len(traced) else None
        if isinstance(value, torch.Tensor):
            shape = value.shape
            if isinstance(seen, torch.Tensor) and seen.dim() == value.dim():
                shape = seen.shape
            sizes = [_size(d) for d in shape]
            spec["symbolic"] = [not isinstance(d, int) for d in sizes]
            spec["shape"] = sizes
        elif isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool) or isinstance(
            seen, torch.SymInt | torch.SymFloat | torch.SymBool
        ):
            spec["value"] = type(seen or value).__name__  # a symbol: its kind, not a value
            spec.pop("hint", None)
    return specs


def _plain(value: Any) -> Any:
    """`value` as JSON can hold it; anything else by its repr (dtypes, paths, callables)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)


def key_parts(
    gm: fx.GraphModule, example_inputs: Sequence[Any], chain: Mapping[str, Any]
) -> dict[str, Any]:
    """Everything the key hashes, as JSON-ready data (kept in the entry, shown by the CLI)."""
    inputs = _inputs(gm, example_inputs)
    devices = [s["device"] for s in inputs if "device" in s] or ["cpu"]
    return {
        "format": FORMAT,
        "graph": graphinfo.graph_hash(gm),
        "inputs": inputs,
        "chain": _plain(chain),
        "environment": environment(devices),
    }


def digest(parts: Mapping[str, Any]) -> str:
    """The key: a hex digest of the parts' canonical JSON."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]
