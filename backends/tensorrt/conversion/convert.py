"""One block -> a runnable engine module: engine cache lookup, else ONNX export and build."""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from backends.common.payload import TensorSpec
from backends.errors import Unsupported
from backends.tensorrt.conversion.cache import EngineCache, cache_key
from backends.tensorrt.conversion.engine import build_engine, tensorrt_version
from backends.tensorrt.conversion.graph_profiles import block_profiles
from backends.tensorrt.conversion.onnx import OnnxModel, export_block
from backends.tensorrt.conversion.profiles import Profile
from backends.tensorrt.runtime.engine_module import TensorRTEngineModule
from backends.tensorrt.settings import Settings

logger = logging.getLogger(__name__)


@dataclass
class BuildRecord:
    """What happened to one block, for the report."""

    name: str
    key: str
    cache_hit: bool
    build_s: float
    inputs: list[dict[str, Any]]
    profiles: int = 0  # optimization profiles of the engine (0: fixed at `inputs`)

    def details(self) -> dict[str, Any]:
        return {
            "block": self.name,
            "cache_key": self.key[:16],
            "cache_hit": self.cache_hit,
            "build_s": round(self.build_s, 3),
            "inputs": self.inputs,
            "profiles": self.profiles,
        }


def returns_tuple(block: fx.GraphModule) -> bool:
    """Whether the block's forward returns a tuple (several outputs) or one tensor."""
    output = next(n for n in reversed(block.graph.nodes) if n.op == "output")
    return isinstance(output.args[0], (tuple, list))


def _profiles(
    block: fx.GraphModule, inputs: tuple[torch.Tensor | int, ...], settings: Settings
) -> list[Profile]:
    """The block's optimization profiles by placeholder name; Unsupported with the reason."""
    try:
        return block_profiles(block, inputs, settings.profile_sizes)
    except ValueError as e:
        raise Unsupported(f"dynamic shapes: no TensorRT optimization profile: {e}") from e


def by_onnx_name(block: fx.GraphModule, onnx: OnnxModel, profiles: list[Profile]) -> list[Profile]:
    """`profiles` keyed by the ONNX input names (the engine's tensor names)."""
    placeholders = [n.name for n in block.graph.find_nodes(op="placeholder")]
    positions = onnx.input_positions or range(len(onnx.input_names))
    names = {placeholders[p]: n for p, n in zip(positions, onnx.input_names, strict=True)}
    return [p.renamed(names) for p in profiles]


def convert_block(
    name: str,
    block: fx.GraphModule,
    inputs: tuple[torch.Tensor | int, ...],
    settings: Settings,
    cache: EngineCache,
    timing: bytes | None,
    dynamic: bool = False,
) -> tuple[TensorRTEngineModule, BuildRecord, bytes | None]:
    """An engine module for `block`, from the cache when the key matches, else built.

    `dynamic`: the block has symbolic sizes; its engine gets one optimization profile per
    range (conversion.graph_profiles; Unsupported with the reason when it cannot)."""
    start = time.perf_counter()
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    specs = [TensorSpec.of(t) for t in tensors]
    device = tensors[0].device if tensors else torch.device("cuda")
    profiles = _profiles(block, inputs, settings) if dynamic else []
    key = cache_key(
        block,
        specs,
        settings.build_key(),
        tensorrt_version(),
        torch.cuda.get_device_name(device),
        profiles=profiles,
    )
    record = BuildRecord(
        name, key, False, 0.0, [{"shape": s.shape, "dtype": s.dtype} for s in specs]
    )
    record.profiles = len(profiles)
    hit = cache.load(key) if settings.engine_cache else None
    if hit is not None:
        try:
            module = TensorRTEngineModule(
                hit.engine,
                hit.meta["inputs"],
                hit.meta["outputs"],
                hit.meta["returns_tuple"],
                [Profile.from_json(p) for p in hit.meta["profiles"]],
                hit.meta["positions"],
            )
            module.load()
        except (KeyError, TypeError, RuntimeError) as e:
            warnings.warn(
                f"cached TensorRT engine {key[:12]} unusable ({type(e).__name__}: {e}); rebuilding",
                RuntimeWarning,
                stacklevel=2,
            )
        else:
            record.cache_hit, record.build_s = True, time.perf_counter() - start
            return module, record, timing
    onnx = export_block(block, inputs, dynamic=dynamic)
    onnx_profiles = by_onnx_name(block, onnx, profiles)
    engine, timing = build_engine(
        onnx,
        specs,
        settings.workspace_size,
        settings.optimization_level,
        timing,
        profiles=onnx_profiles or None,
    )
    meta = {
        "inputs": list(onnx.input_names),
        "outputs": list(onnx.output_names),
        "returns_tuple": returns_tuple(block),
        "tensorrt": tensorrt_version(),
        "profiles": [p.to_json() for p in onnx_profiles],
        "positions": None if onnx.input_positions is None else list(onnx.input_positions),
    }
    if settings.engine_cache:
        cache.store(key, engine, meta)
    module = TensorRTEngineModule(
        engine,
        onnx.input_names,
        onnx.output_names,
        meta["returns_tuple"],
        onnx_profiles,
        onnx.input_positions,
    )
    record.build_s = time.perf_counter() - start
    logger.debug("built TensorRT engine %s in %.2fs (key %s)", name, record.build_s, key[:12])
    return module, record, timing
