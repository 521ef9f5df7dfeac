"""Partitioning: which ops go to TensorRT, which stay in PyTorch, and why.

The partitioner itself is shared (`backends.common.partitioner`); TensorRT brings its
support table.
"""

from backends.common.partitioner import PartitionOptions, PartitionResult, block_calls
from backends.tensorrt.partitioning.support import (
    SUPPORT_TABLE,
    OpSupport,
    check,
    partition,
    tensorrt_support,
)

__all__ = [
    "SUPPORT_TABLE",
    "OpSupport",
    "PartitionOptions",
    "PartitionResult",
    "block_calls",
    "check",
    "partition",
    "tensorrt_support",
]
