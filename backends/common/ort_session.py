"""ONNX Runtime session pieces shared by the ORT backend and the benchmark's direct-ORT peer.

Session options from our option names and the ONNX element type IOBinding takes for a torch
dtype: what anything that runs an ORT session on torch tensors needs, the backend or not.
"""

from __future__ import annotations

from typing import Any

import torch

from backends.errors import Unsupported

LEVELS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}


def session_options(
    graph_optimization_level: str = "all",
    intra_op_num_threads: int | None = None,
    allow_spinning: bool = False,
) -> Any:
    """ORT SessionOptions from our option names (level: disable|basic|extended|all).

    Spinning is off by default: every graph gets its own session and thread pool, and
    idle pools that spin steal the cores from torch's threads and from each other (on
    2 cores, eager ResNet went from 12 ms to 670 ms between spinning ORT calls; the
    direct ConvNeXt ran 12.8 ms without spinning, 28.2 ms with it, 44.6 ms with ORT's
    defaults: `benchmarks/ort_overhead.py --sweep`). Threads: `intra_op_num_threads` None
    is ORT's default (one per physical core); the backend times it against one thread per
    graph on CPU (`backends.onnxruntime.threads`).
    """
    import onnxruntime as ort

    if graph_optimization_level not in LEVELS:
        raise ValueError(
            f"graph_optimization_level {graph_optimization_level!r}; valid: {', '.join(LEVELS)}"
        )
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(
        ort.GraphOptimizationLevel, LEVELS[graph_optimization_level]
    )
    if intra_op_num_threads is not None:
        options.intra_op_num_threads = int(intra_op_num_threads)
    options.add_session_config_entry(
        "session.intra_op.allow_spinning", "1" if allow_spinning else "0"
    )
    options.log_severity_level = 3  # errors only: keep the chain's report readable
    return options


def element_type(dtype: torch.dtype) -> int:
    """The ONNX element type IOBinding takes for a torch dtype (onnx_ir's own mapping)."""
    from onnx_ir.tensor_adapters import from_torch_dtype

    try:
        return int(from_torch_dtype(dtype))
    except TypeError as error:
        raise Unsupported(f"{dtype} has no ONNX element type for IOBinding") from error
