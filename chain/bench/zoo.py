"""Small transformers models from configs, each with inputs at three shapes.

The safety suite's models (BertModel, GPT2Model, a T5 encoder, ViTModel, LlamaModel): random
weights, tiny configs (2 layers, hidden 32), eval mode, nothing downloaded. Text models
change their sequence length from call to call, ViT its batch: the second shape is where
dynamo recompiles with a dynamic dim, the third runs that dynamic graph.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from chain.bench.real_models import TRANSFORMERS, LastHidden

VOCAB = 100
TEXT_SHAPES = ((2, 8), (2, 12), (2, 16))  # (batch, sequence length)
IMAGE_BATCHES = (2, 3, 5)  # 32x32 images
MODELS = ("bert", "gpt2", "t5_encoder", "vit", "llama")

available = TRANSFORMERS  # why these models cannot be built here (None: they can)


def _bert() -> nn.Module:
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64,
    )  # fmt: skip
    return BertModel(config)


def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, use_cache=False,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return GPT2Model(config)


def _t5_encoder() -> nn.Module:
    from transformers import T5Config, T5EncoderModel

    config = T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        use_cache=False,
    )  # fmt: skip
    return T5EncoderModel(config)


def _vit() -> nn.Module:
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=64,
    )  # fmt: skip
    return ViTModel(config, add_pooling_layer=False)


def _llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        use_cache=False,
    )  # fmt: skip
    return LlamaModel(config)


_BUILDERS: dict[str, Callable[[], nn.Module]] = {
    "bert": _bert,
    "gpt2": _gpt2,
    "t5_encoder": _t5_encoder,
    "vit": _vit,
    "llama": _llama,
}


def build(name: str) -> nn.Module:
    """The model `name` (one of MODELS) in eval mode, returning its last hidden state."""
    if name not in _BUILDERS:
        raise ValueError(f"unknown model {name!r}; one of {', '.join(MODELS)}")
    torch.manual_seed(0)
    return LastHidden(_BUILDERS[name]()).eval()


def inputs(name: str, shape: int) -> tuple[torch.Tensor, ...]:
    """The model's inputs at its `shape`-th shape (0, 1 or 2), seeded."""
    generator = torch.Generator().manual_seed(shape)
    if name == "vit":
        return (torch.randn(IMAGE_BATCHES[shape], 3, 32, 32, generator=generator),)
    batch, seq = TEXT_SHAPES[shape]
    return (torch.randint(0, VOCAB, (batch, seq), generator=generator),)


def describe(name: str, shape: int) -> str:
    """The shape in words: `2x12` tokens or `3 images`."""
    if name == "vit":
        return f"{IMAGE_BATCHES[shape]} images"
    batch, seq = TEXT_SHAPES[shape]
    return f"{batch}x{seq}"
