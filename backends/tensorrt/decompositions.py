"""The curated decomposition table: core ATen, minus the ops TensorRT handles whole.

TensorRT has fused kernels for GEMMs with bias, normalisations, attention-style softmax and
convolutions; decomposing them into primitives only makes its pattern matching work harder.
The fused transformer fast path (`_transformer_encoder_layer_fwd`, taken by
`nn.TransformerEncoderLayer` under no_grad) has no converter anywhere, so it is written out
in the ops above (`backends.common.fast_paths`, the spelling the ONNX export uses too).
"""

from __future__ import annotations

from typing import Any

import torch

from backends.common.fast_paths import encoder_layer_decomposition

aten = torch.ops.aten

KEEP_WHOLE: tuple[Any, ...] = (
    aten.linear.default,
    aten.addmm.default,
    aten.matmul.default,
    aten._softmax.default,
    aten.softmax.int,
    aten.layer_norm.default,
    aten.native_layer_norm.default,
    aten.gelu.default,
    aten.silu.default,
    aten.hardswish.default,
    aten.convolution.default,
    aten.conv2d.default,
    aten._native_batch_norm_legit_no_training.default,
    aten.batch_norm.default,
    aten.adaptive_avg_pool2d.default,
    aten.embedding.default,
    aten.scaled_dot_product_attention.default,
)


def decomposition_table() -> Any:
    """torch.export's default (core ATen) table without KEEP_WHOLE, plus our own entries."""
    from torch.export import default_decompositions

    table = default_decompositions()
    for op in KEEP_WHOLE:
        if op in table:
            del table[op]
    table[aten._transformer_encoder_layer_fwd.default] = encoder_layer_decomposition
    return table
