"""The curated decomposition table: core ATen, minus the ops TensorRT handles whole.

TensorRT has fused kernels for GEMMs with bias, normalisations, attention-style softmax and
convolutions; decomposing them into primitives only makes its pattern matching work harder.
The fused transformer fast path (`_transformer_encoder_layer_fwd`, taken by
`nn.TransformerEncoderLayer` under no_grad) has no converter anywhere, so it is written out
here in the ops above.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

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


def _transformer_encoder_layer(
    src: Tensor,
    embed_dim: int,
    num_heads: int,
    qkv_weight: Tensor,
    qkv_bias: Tensor,
    proj_weight: Tensor,
    proj_bias: Tensor,
    use_gelu: bool,
    norm_first: bool,
    eps: float,
    norm_weight_1: Tensor,
    norm_bias_1: Tensor,
    norm_weight_2: Tensor,
    norm_bias_2: Tensor,
    ffn_weight_1: Tensor,
    ffn_bias_1: Tensor,
    ffn_weight_2: Tensor,
    ffn_bias_2: Tensor,
    mask: Tensor | None = None,
    mask_type: int | None = None,
) -> Tensor:
    """`nn.TransformerEncoderLayer`'s fused fast path in linear/matmul/softmax/layer_norm."""
    if mask is not None or src.dim() != 3:
        return NotImplemented
    f = torch.nn.functional

    def attention(x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        head_dim = embed_dim // num_heads
        qkv = f.linear(x, qkv_weight, qkv_bias).reshape(batch, length, 3, num_heads, head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(head_dim))
        out = torch.matmul(torch.softmax(scores, dim=-1), v)
        out = out.permute(0, 2, 1, 3).reshape(batch, length, embed_dim)
        return f.linear(out, proj_weight, proj_bias)

    def feed_forward(x: Tensor) -> Tensor:
        hidden = f.linear(x, ffn_weight_1, ffn_bias_1)
        hidden = f.gelu(hidden) if use_gelu else f.relu(hidden)
        return f.linear(hidden, ffn_weight_2, ffn_bias_2)

    def norm1(x: Tensor) -> Tensor:
        return f.layer_norm(x, (embed_dim,), norm_weight_1, norm_bias_1, eps)

    def norm2(x: Tensor) -> Tensor:
        return f.layer_norm(x, (embed_dim,), norm_weight_2, norm_bias_2, eps)

    if norm_first:
        x = src + attention(norm1(src))
        return x + feed_forward(norm2(x))
    x = norm1(src + attention(src))
    return norm2(x + feed_forward(x))


def decomposition_table() -> Any:
    """torch.export's default (core ATen) table without KEEP_WHOLE, plus our own entries."""
    from torch.export import default_decompositions

    table = default_decompositions()
    for op in KEEP_WHOLE:
        if op in table:
            del table[op]
    table[aten._transformer_encoder_layer_fwd.default] = _transformer_encoder_layer
    return table
