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
from backends.tensorrt.conversion.cache import EngineCache, cache_key
from backends.tensorrt.conversion.engine import build_engine, tensorrt_version
from backends.tensorrt.conversion.onnx import export_block
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

    def details(self) -> dict[str, Any]:
        return {
            "block": self.name,
            "cache_key": self.key[:16],
            "cache_hit": self.cache_hit,
            "build_s": round(self.build_s, 3),
            "inputs": self.inputs,
        }


def returns_tuple(block: fx.GraphModule) -> bool:
    """Whether the block's forward returns a tuple (several outputs) or one tensor."""
    output = next(n for n in reversed(block.graph.nodes) if n.op == "output")
    return isinstance(output.args[0], (tuple, list))


def convert_block(
    name: str,
    block: fx.GraphModule,
    inputs: tuple[torch.Tensor, ...],
    settings: Settings,
    cache: EngineCache,
    timing: bytes | None,
) -> tuple[TensorRTEngineModule, BuildRecord, bytes | None]:
    """An engine module for `block`, from the cache when the key matches, else built."""
    start = time.perf_counter()
    specs = [TensorSpec.of(t) for t in inputs]
    device = inputs[0].device if inputs else torch.device("cuda")
    key = cache_key(
        block, specs, settings.build_key(), tensorrt_version(), torch.cuda.get_device_name(device)
    )
    record = BuildRecord(
        name, key, False, 0.0, [{"shape": s.shape, "dtype": s.dtype} for s in specs]
    )
    hit = cache.load(key) if settings.engine_cache else None
    if hit is not None:
        try:
            module = TensorRTEngineModule(
                hit.engine, hit.meta["inputs"], hit.meta["outputs"], hit.meta["returns_tuple"]
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
    onnx = export_block(block, inputs)
    engine, timing = build_engine(
        onnx, specs, settings.workspace_size, settings.optimization_level, timing
    )
    meta = {
        "inputs": list(onnx.input_names),
        "outputs": list(onnx.output_names),
        "returns_tuple": returns_tuple(block),
        "tensorrt": tensorrt_version(),
    }
    if settings.engine_cache:
        cache.store(key, engine, meta)
    module = TensorRTEngineModule(
        engine, onnx.input_names, onnx.output_names, meta["returns_tuple"]
    )
    record.build_s = time.perf_counter() - start
    logger.debug("built TensorRT engine %s in %.2fs (key %s)", name, record.build_s, key[:12])
    return module, record, timing
