"""Block -> ONNX through the ORT backend's exporter, so TensorRT parses what ORT verifies."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import fx

from backends.common.onnx_export import export_onnx
from backends.errors import Unsupported


@dataclass(frozen=True)
class OnnxModel:
    """A serialized ONNX model and the names of its graph inputs and outputs, in order."""

    data: bytes
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]


def export_block(block: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> OnnxModel:
    """Export one TensorRT block; its weights are buffers already, so they become initializers.

    Every block input must stay an ONNX input (the engine binds them by position).
    """
    try:
        graph = export_onnx(block, list(example_inputs), freeze=())
    except Unsupported as e:
        raise Unsupported(f"ONNX export of a TensorRT block failed: {e.reason}", e.detail) from e
    if graph.input_positions != tuple(range(len(example_inputs))):
        raise Unsupported(
            f"ONNX export of a TensorRT block dropped inputs: kept {graph.input_positions} "
            f"of {len(example_inputs)}"
        )
    return OnnxModel(graph.model, graph.input_names, graph.output_names)
