"""Whether the tensorrt backend can run here, and whether it can take a given graph."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

import torch

from backends.common.fx_utils import refuse_training
from backends.errors import Unsupported

NOT_INSTALLED = "tensorrt is not installed: pip install 'backend-chain[gpu]'"
NO_CUDA = "no CUDA device (torch.cuda.is_available() is False)"


def available() -> str | None:
    """None when a CUDA device is present and TensorRT imports, else the precise reason.

    The device comes first: on a machine without one, installing TensorRT cannot help.
    """
    if not torch.cuda.is_available():
        return NO_CUDA
    if importlib.util.find_spec("tensorrt") is None:
        return NOT_INSTALLED
    try:
        import tensorrt  # noqa: F401
    except (ImportError, OSError) as e:
        return f"tensorrt is installed but does not import: {e}"
    return None


def check_inference_graph(example_inputs: Sequence[Any]) -> None:
    """Raise Unsupported for a training graph: TensorRT engines have no backward."""
    refuse_training(example_inputs, "TensorRT builds inference engines")


def check_devices(example_inputs: Sequence[Any]) -> None:
    """Raise Unsupported unless every tensor input lives on a CUDA device (engines run there)."""
    devices = sorted({str(x.device) for x in example_inputs if isinstance(x, torch.Tensor)})
    off_gpu = [d for d in devices if not d.startswith("cuda")]
    if off_gpu:
        raise Unsupported(
            f"inputs on {', '.join(off_gpu)}: TensorRT engines run on CUDA tensors "
            "(move the model and inputs to the GPU)"
        )
