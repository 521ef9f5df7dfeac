"""ONNX -> TensorRT engine: OnnxParser into a strongly typed network, then a serialized engine.

Written against TensorRT 10/11's Python API (11 removed the precision flags: types come
from the ONNX model, hence STRONGLY_TYPED). Runs only where tensorrt and a GPU are present.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from backends.common.payload import TensorSpec
from backends.errors import Unsupported
from backends.tensorrt.conversion.onnx import OnnxModel
from backends.tensorrt.conversion.profiles import Profile

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ParserIssue:
    """One node the ONNX parser refused."""

    node: int
    name: str
    operator: str
    description: str

    def __str__(self) -> str:
        where = f"{self.operator or '?'} node {self.name or self.node}"
        return f"{where}: {self.description}"


class ParseFailed(Unsupported):
    """TensorRT's ONNX parser refused nodes of a block; `issues` lists them one by one."""

    def __init__(self, issues: Sequence[ParserIssue]) -> None:
        ops = sorted({i.operator or "?" for i in issues})
        super().__init__(
            f"TensorRT's ONNX parser rejected {len(issues)} node(s) ({', '.join(ops)})",
            detail="\n".join(str(i) for i in issues),
        )
        self.issues = tuple(issues)


def trt_logger() -> Any:
    """One TensorRT logger per process (TensorRT wants it to outlive its builders)."""
    import tensorrt as trt

    global _LOGGER
    if _LOGGER is None:
        _LOGGER = trt.Logger(trt.Logger.WARNING)
    return _LOGGER


_LOGGER: Any = None


def parse(onnx: OnnxModel) -> tuple[Any, Any, Any]:
    """(builder, network, parser) with `onnx` parsed into a strongly typed network."""
    import tensorrt as trt

    builder = trt.Builder(trt_logger())
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, trt_logger())
    if not parser.parse(onnx.data):
        issues = []
        for i in range(parser.num_errors):
            error = parser.get_error(i)
            issues.append(
                ParserIssue(
                    node=int(error.node()),
                    name=str(error.node_name()),
                    operator=str(error.node_operator()),
                    description=str(error.desc()),
                )
            )
        raise ParseFailed(issues or [ParserIssue(-1, "", "", "parse() returned False")])
    return builder, network, parser


def build_engine(
    onnx: OnnxModel,
    inputs: Sequence[TensorSpec],
    workspace_size: int,
    optimization_level: int,
    timing_cache: bytes | None,
    profiles: Sequence[Profile] | None = None,
) -> tuple[bytes, bytes | None]:
    """Build a serialized engine; returns it and the updated timing cache (if one was used).

    `profiles`: one optimization profile each (min/opt/max per input, see
    conversion.profiles: one per bucket range); None: one profile fixed at `inputs`."""
    import tensorrt as trt

    builder, network, _parser = parse(onnx)
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_size)
    config.builder_optimization_level = optimization_level
    if profiles is None:
        profile = builder.create_optimization_profile()
        for name, spec in zip(onnx.input_names, inputs, strict=True):
            # min == opt == max: a static graph; a new size is a new (cached) engine
            profile.set_shape(name, spec.shape, spec.shape, spec.shape)
        config.add_optimization_profile(profile)
    for ranges in profiles or ():
        profile = builder.create_optimization_profile()
        for name in onnx.input_names:
            low, opt, high = ranges.shapes[name]
            profile.set_shape(name, low, opt, high)
        if config.add_optimization_profile(profile) < 0:
            raise RuntimeError(f"TensorRT refused the optimization profile {ranges.shapes}")
    if timing_cache is not None:
        config.set_timing_cache(_timing_cache(config, timing_cache), ignore_mismatch=False)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError("TensorRT build_serialized_network returned None (see its log)")
    new_cache = bytes(config.get_timing_cache().serialize()) if timing_cache is not None else None
    return bytes(serialized), new_cache


def _timing_cache(config: Any, data: bytes) -> Any:
    """A timing cache from `data`; unreadable bytes warn and start an empty cache."""
    try:
        return config.create_timing_cache(data)
    except (RuntimeError, TypeError, ValueError) as e:
        warnings.warn(f"ignoring corrupt TensorRT timing cache: {e}", RuntimeWarning, stacklevel=2)
        return config.create_timing_cache(b"")


def tensorrt_version() -> str:
    import tensorrt as trt

    return str(trt.__version__)
