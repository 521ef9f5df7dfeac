"""Small transformers models from configs, each with inputs at three shapes.

The safety suite's models (BertModel, GPT2Model, a T5 encoder, ViTModel, LlamaModel): random
weights, tiny configs (2 layers, hidden 32), eval mode, nothing downloaded. Text models
change their sequence length from call to call, ViT its batch: the second shape is where
dynamo recompiles with a dynamic dim, the third runs that dynamic graph.

`ARCHITECTURES` are the wider set the `dynamic=True` suite runs (GPT-NeoX, Falcon, Phi,
Gemma, a Whisper encoder, ViT, CLIP text, wav2vec2, a T5 encoder, BLOOM): each carries
Python float attributes (an eps, a scale) that dynamo lifts to tensors under dynamic=True.
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


# the dynamic=True architectures: (config class, model class, config), all in `transformers`
_CONFIGS: dict[str, tuple[str, str, dict[str, object]]] = {
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXModel", {
        "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 64, "max_position_embeddings": 64, "use_cache": False,
    }),
    "falcon": ("FalconConfig", "FalconModel", {
        "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "use_cache": False,
    }),
    "phi": ("PhiConfig", "PhiModel", {
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "max_position_embeddings": 64, "use_cache": False,
    }),
    "gemma": ("GemmaConfig", "GemmaModel", {
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "max_position_embeddings": 64, "use_cache": False,
    }),
    "clip_text": ("CLIPTextConfig", "CLIPTextModel", {
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "max_position_embeddings": 64,
    }),
    "wav2vec2": ("Wav2Vec2Config", "Wav2Vec2Model", {
        "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 64, "conv_dim": (16, 16), "conv_stride": (5, 2),
        "conv_kernel": (10, 3), "num_feat_extract_layers": 2, "num_conv_pos_embeddings": 16,
        "num_conv_pos_embedding_groups": 4,
    }),
    "bloom": ("BloomConfig", "BloomModel", {"hidden_size": 32, "n_layer": 2, "n_head": 4,
                                            "use_cache": False}),
}  # fmt: skip
NO_VOCAB = {"wav2vec2"}  # audio: its config is built without a vocabulary size


def _from_config(name: str) -> Callable[[], nn.Module]:
    """A builder of architecture `name` from its `_CONFIGS` entry."""

    def build() -> nn.Module:
        import transformers

        config_class, model_class, config = _CONFIGS[name]
        vocab = {} if name in NO_VOCAB else {"vocab_size": VOCAB}
        made = getattr(transformers, config_class)(**vocab, **config)
        return getattr(transformers, model_class)(made)

    return build


def _whisper_encoder() -> nn.Module:
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    config = WhisperConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, encoder_attention_heads=4,
        encoder_ffn_dim=64, num_mel_bins=16, max_source_positions=16,
    )  # fmt: skip
    return WhisperEncoder(config)


_BUILDERS: dict[str, Callable[[], nn.Module]] = {
    "bert": _bert,
    "gpt2": _gpt2,
    "t5_encoder": _t5_encoder,
    "vit": _vit,
    "llama": _llama,
    "whisper_encoder": _whisper_encoder,
    **{name: _from_config(name) for name in _CONFIGS},
}
ARCHITECTURES = (
    "gpt_neox", "falcon", "phi", "gemma", "whisper_encoder", "vit", "clip_text", "wav2vec2",
    "t5_encoder", "bloom",
)  # fmt: skip
WHISPER_FRAMES = 32  # the encoder takes exactly 2 x max_source_positions frames
AUDIO_SAMPLES = (400, 560, 720)  # wav2vec2: raw samples per example


def build(name: str) -> nn.Module:
    """The model `name` (one of MODELS) in eval mode, returning its last hidden state."""
    if name not in _BUILDERS:
        raise ValueError(f"unknown model {name!r}; one of {', '.join(_BUILDERS)}")
    torch.manual_seed(0)
    return LastHidden(_BUILDERS[name]()).eval()


def inputs(name: str, shape: int) -> tuple[torch.Tensor, ...]:
    """The model's inputs at its `shape`-th shape (0, 1 or 2), seeded."""
    generator = torch.Generator().manual_seed(shape)
    if name == "vit":
        return (torch.randn(IMAGE_BATCHES[shape], 3, 32, 32, generator=generator),)
    if name == "whisper_encoder":
        return (torch.randn(IMAGE_BATCHES[shape], 16, WHISPER_FRAMES, generator=generator),)
    if name == "wav2vec2":
        return (torch.randn(2, AUDIO_SAMPLES[shape], generator=generator),)
    batch, seq = TEXT_SHAPES[shape]
    return (torch.randint(0, VOCAB, (batch, seq), generator=generator),)


def describe(name: str, shape: int) -> str:
    """The shape in words: `2x12` tokens or `3 images`."""
    if name == "vit":
        return f"{IMAGE_BATCHES[shape]} images"
    if name == "whisper_encoder":
        return f"{IMAGE_BATCHES[shape]}x16x{WHISPER_FRAMES} mels"
    if name == "wav2vec2":
        return f"2x{AUDIO_SAMPLES[shape]} samples"
    batch, seq = TEXT_SHAPES[shape]
    return f"{batch}x{seq}"
