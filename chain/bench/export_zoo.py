"""Tiny transformers models of ten architectures, for the export matrix and its benchmark.

Random weights, tiny configs, eval mode, nothing downloaded. Each builder returns the model
(its own transformers output class, as users call it) and example inputs; `shapes` gives a
second input of another size for the models that take one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

VOCAB = 100
Built = tuple[nn.Module, tuple[torch.Tensor, ...]]


def _ids(batch: int = 2, seq: int = 8) -> tuple[torch.Tensor, ...]:
    return (torch.randint(0, VOCAB, (batch, seq)),)


def _image(size: int = 32, batch: int = 2) -> tuple[torch.Tensor, ...]:
    return (torch.randn(batch, 3, size, size),)


def bert() -> Built:
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64,
    )  # fmt: skip
    return BertModel(config), _ids()


def distilbert() -> Built:
    from transformers import DistilBertConfig, DistilBertModel

    config = DistilBertConfig(
        vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
        max_position_embeddings=64,
    )  # fmt: skip
    return DistilBertModel(config), _ids()


def llama() -> Built:
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        use_cache=False,
    )  # fmt: skip
    return LlamaModel(config), _ids()


def t5_encoder() -> Built:
    from transformers import T5Config, T5EncoderModel

    config = T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        use_cache=False,
    )  # fmt: skip
    return T5EncoderModel(config), _ids()


def swin() -> Built:
    from transformers import SwinConfig, SwinModel

    config = SwinConfig(
        image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
        window_size=4,
    )  # fmt: skip
    return SwinModel(config), _image()


def vit() -> Built:
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=64,
    )  # fmt: skip
    return ViTModel(config), _image()


def convnext() -> Built:
    from transformers import ConvNextConfig, ConvNextModel

    config = ConvNextConfig(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, image_size=32)
    return ConvNextModel(config), _image()


def resnet() -> Built:
    from transformers import ResNetConfig, ResNetModel

    config = ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic",
    )  # fmt: skip
    return ResNetModel(config), _image()


def clip_vision() -> Built:
    from transformers import CLIPVisionConfig, CLIPVisionModel

    config = CLIPVisionConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=64,
    )  # fmt: skip
    return CLIPVisionModel(config), _image()


def whisper_encoder() -> Built:
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    config = WhisperConfig(
        num_mel_bins=8, d_model=32, encoder_layers=2, encoder_attention_heads=4,
        encoder_ffn_dim=64, max_source_positions=16,
    )  # fmt: skip
    return WhisperEncoder(config), (torch.randn(2, 8, 32),)


BUILDERS: dict[str, Callable[[], Built]] = {
    "bert": bert,
    "distilbert": distilbert,
    "llama": llama,
    "t5_encoder": t5_encoder,
    "swin": swin,
    "vit": vit,
    "convnext": convnext,
    "resnet": resnet,
    "clip_vision": clip_vision,
    "whisper_encoder": whisper_encoder,
}
ARCHITECTURES = tuple(BUILDERS)


def build(name: str) -> Built:
    """The model `name` (one of ARCHITECTURES) in eval mode and its inputs, seeded."""
    if name not in BUILDERS:
        raise ValueError(f"unknown architecture {name!r}; one of {', '.join(ARCHITECTURES)}")
    torch.manual_seed(0)
    model, args = BUILDERS[name]()
    return model.eval(), args


def leaves(outputs: Any) -> list[torch.Tensor]:
    """The tensors of a model's outputs (a transformers output class, a tuple, a tensor)."""
    from torch.utils import _pytree as pytree

    return [t for t in pytree.tree_leaves(outputs) if isinstance(t, torch.Tensor)]
