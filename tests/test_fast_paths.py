"""backends.common.fast_paths: the one spelling of PyTorch's fused fast paths, against them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from backends.common.fast_paths import encoder_layer, encoder_layer_decomposition, native_mha


def _layer_args(layer: nn.TransformerEncoderLayer, gelu: bool, norm_first: bool) -> list:
    attn = layer.self_attn
    return [
        attn.embed_dim,
        attn.num_heads,
        attn.in_proj_weight,
        attn.in_proj_bias,
        attn.out_proj.weight,
        attn.out_proj.bias,
        gelu,
        norm_first,
        layer.norm1.eps,
        layer.norm1.weight,
        layer.norm1.bias,
        layer.norm2.weight,
        layer.norm2.bias,
        layer.linear1.weight,
        layer.linear1.bias,
        layer.linear2.weight,
        layer.linear2.bias,
    ]


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("gelu", [False, True])
def test_encoder_layer_matches_the_fused_kernel(norm_first: bool, gelu: bool) -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, norm_first=norm_first)
    src = torch.randn(2, 5, 16)
    args = _layer_args(layer.eval(), gelu, norm_first)
    with torch.no_grad():
        fused = torch._transformer_encoder_layer_fwd(src, *args, None)
        spelled = encoder_layer(src, *args)
        decomposed = encoder_layer_decomposition(src, *args)
    torch.testing.assert_close(spelled, fused, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(decomposed, fused, rtol=1e-5, atol=1e-5)


def test_decomposition_declines_masks_and_unbatched_inputs() -> None:
    layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True).eval()
    args = _layer_args(layer, False, False)
    mask = torch.zeros(5, 5, dtype=torch.bool)
    assert encoder_layer_decomposition(torch.randn(2, 5, 16), *args, mask) is NotImplemented
    assert encoder_layer_decomposition(torch.randn(5, 16), *args) is NotImplemented


def test_native_mha_matches_cross_attention() -> None:
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    query, memory = torch.randn(2, 3, 16), torch.randn(2, 7, 16)
    with torch.no_grad():
        expected, _ = mha(query, memory, memory, need_weights=False)
        out, weights = native_mha(
            query,
            memory,
            memory,
            16,
            4,
            mha.in_proj_weight,
            mha.in_proj_bias,
            mha.out_proj.weight,
            mha.out_proj.bias,
        )
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert weights.numel() == 0
