"""Partitioning: which ops go to TensorRT, which stay in PyTorch, and why."""

from backends.tensorrt.partitioning.partitioner import (
    PartitionOptions,
    PartitionResult,
    engine_calls,
    partition,
)
from backends.tensorrt.partitioning.support import SUPPORT_TABLE, OpSupport, check

__all__ = [
    "SUPPORT_TABLE",
    "OpSupport",
    "PartitionOptions",
    "PartitionResult",
    "check",
    "engine_calls",
    "partition",
]
