"""Block -> ONNX, through the same exporter as the ORT backend (`torch.onnx.export(dynamo=True)`).

A thin adapter: once `backends/onnxruntime/export.py` (`export_onnx`) is on main, this calls
it instead, so the model TensorRT parses is the one ORT verifies on CPU.
"""

from __future__ import annotations

import logging
import traceback
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import fx

from backends.errors import Unsupported

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OnnxModel:
    """A serialized ONNX model and the names of its graph inputs and outputs, in order."""

    data: bytes
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]


def export_block(block: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> OnnxModel:
    """Export one TensorRT block (weights as initializers); failures become Unsupported."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    try:
        with unset_fake_temporarily(), torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                block, tuple(example_inputs), dynamo=True, optimize=True, verbose=False
            )
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise Unsupported(
            f"ONNX export of a TensorRT block failed: {first}", detail=traceback.format_exc()
        ) from e
    proto = program.model_proto
    return OnnxModel(
        data=proto.SerializeToString(),
        input_names=tuple(i.name for i in proto.graph.input),
        output_names=tuple(o.name for o in proto.graph.output),
    )
