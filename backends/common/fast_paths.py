"""PyTorch's fused inference fast paths spelled out in plain ops, for exporters and compilers.

`nn.TransformerEncoderLayer` and `nn.MultiheadAttention` take fused kernels under no_grad
(`_transformer_encoder_layer_fwd`, `_native_multi_head_attention`) that have no ONNX
translation and no TensorRT converter. One spelling of each serves both: the ONNX
preparation retargets the calls (`onnx_prepare`), TensorRT's decomposition table uses
`encoder_layer_decomposition` (linear, matmul, softmax and layer_norm, which it keeps whole).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F


def _attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    num_heads: int,
    qkv_weight: torch.Tensor,
    qkv_bias: torch.Tensor,
    proj_weight: torch.Tensor,
    proj_bias: torch.Tensor,
) -> torch.Tensor:
    """Batch-first multi-head self/cross attention without a mask, in plain ops.

    Self-attention (one tensor for query, key and value) projects with one GEMM, which
    compilers run better than three.
    """
    batch, length, embed = query.shape
    head_dim = embed // num_heads
    if query is key and key is value:
        qkv = F.linear(query, qkv_weight, qkv_bias).reshape(batch, length, 3, num_heads, head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    else:
        q_w, k_w, v_w = qkv_weight.chunk(3, 0)
        q_b, k_b, v_b = qkv_bias.chunk(3, 0)

        def heads(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return F.linear(x, w, b).reshape(batch, -1, num_heads, head_dim).transpose(1, 2)

        q, k, v = heads(query, q_w, q_b), heads(key, k_w, k_b), heads(value, v_w, v_b)
    scores = torch.softmax((q @ k.transpose(-2, -1)) / math.sqrt(head_dim), dim=-1)
    attended = (scores @ v).transpose(1, 2).reshape(batch, length, embed)
    return F.linear(attended, proj_weight, proj_bias)


def native_mha(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    embed_dim: int,
    num_heads: int,
    qkv_weight: torch.Tensor,
    qkv_bias: torch.Tensor,
    proj_weight: torch.Tensor,
    proj_bias: torch.Tensor,
    mask: torch.Tensor | None = None,
    need_weights: bool = True,
    average_attn_weights: bool = True,
    mask_type: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`torch._native_multi_head_attention` (nn.MultiheadAttention's fast path), mask-free."""
    out = _attention(query, key, value, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias)
    return out, query.new_empty(0)


def encoder_layer(
    src: torch.Tensor,
    embed_dim: int,
    num_heads: int,
    qkv_weight: torch.Tensor,
    qkv_bias: torch.Tensor,
    proj_weight: torch.Tensor,
    proj_bias: torch.Tensor,
    use_gelu: bool,
    norm_first: bool,
    eps: float,
    norm_weight_1: torch.Tensor,
    norm_bias_1: torch.Tensor,
    norm_weight_2: torch.Tensor,
    norm_bias_2: torch.Tensor,
    ffn_weight_1: torch.Tensor,
    ffn_bias_1: torch.Tensor,
    ffn_weight_2: torch.Tensor,
    ffn_bias_2: torch.Tensor,
    mask: torch.Tensor | None = None,
    mask_type: int | None = None,
) -> torch.Tensor:
    """`torch._transformer_encoder_layer_fwd` (nn.TransformerEncoderLayer's fast path)."""

    def norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (embed_dim,), w, b, eps)

    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    x = _attention(x, x, x, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias) + src
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    h = norm(x, norm_weight_2, norm_bias_2) if norm_first else x
    h = F.linear(h, ffn_weight_1, ffn_bias_1)
    h = F.gelu(h) if use_gelu else F.relu(h)
    x = x + F.linear(h, ffn_weight_2, ffn_bias_2)
    return x if norm_first else norm(x, norm_weight_2, norm_bias_2)


def encoder_layer_decomposition(src: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """`encoder_layer` as a decomposition-table entry: NotImplemented for masked or unbatched."""
    mask = args[17] if len(args) > 17 else kwargs.get("mask")
    if mask is not None or src.dim() != 3:
        return NotImplemented
    return encoder_layer(src, *args, **kwargs)
