"""The real-model suite (`--suite real`): timm and transformers models built from configs.

Random weights, nothing downloaded: resnet50, vit_base_patch16_224 and convnext_tiny from
timm (`timm.create_model(..., pretrained=False)`), BertModel (bert-base config), GPT2Model
(gpt2 config) and a T5 encoder (t5-small config) from transformers, and a launch-bound
24-layer MLP at batch 1. A model whose library cannot be imported here is a row with the
reason. `tiny=True` (`--quick`) keeps each architecture but shrinks it (2 layers, hidden
32-64, small images) so that a CPU smoke run takes seconds.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from chain.bench.models import Inputs, ModelSpec


def import_reason(module: str, extra: str) -> Callable[[], str | None]:
    """An `available()` that imports `module` and says why not (the error itself)."""

    def available() -> str | None:
        try:
            __import__(module)
        except Exception as error:  # ImportError, or a broken dependency (timm: torchvision)
            return f"{module} cannot be imported ({type(error).__name__}: {error}): {extra}"
        return None

    return available


TIMM = import_reason("timm", "pip install timm torchvision")
TRANSFORMERS = import_reason("transformers", "pip install 'backend-chain[bench]'")


class LastHidden(nn.Module):
    """A transformers model returning its last hidden state: one tensor, no output dict."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.model(*inputs).last_hidden_state


def _ids(batch: int, seq: int, vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq))


def timm_builder(name: str, tiny_kwargs: dict[str, Any], image: int, tiny_image: int) -> Any:
    """A builder for a timm model by name, with its tiny form's keyword overrides."""

    def build(batch: int, tiny: bool) -> tuple[nn.Module, Inputs]:
        import timm

        kwargs = tiny_kwargs if tiny else {}
        model = timm.create_model(name, pretrained=False, **kwargs)
        size = tiny_image if tiny else image
        return model, (torch.randn(batch, 3, size, size),)

    return build


def build_bert(batch: int, tiny: bool) -> tuple[nn.Module, Inputs]:
    from transformers import BertConfig, BertModel

    seq = 16 if tiny else 128
    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    config = BertConfig(**(small if tiny else {}))  # bert-base: 768 hidden, 12 layers
    ids = _ids(batch, seq, config.vocab_size)
    return LastHidden(BertModel(config)), (ids, torch.ones(batch, seq, dtype=torch.long))


def build_gpt2(batch: int, tiny: bool) -> tuple[nn.Module, Inputs]:
    from transformers import GPT2Config, GPT2Model

    seq = 16 if tiny else 128
    small = dict(n_embd=32, n_layer=2, n_head=2)
    config = GPT2Config(use_cache=False, **(small if tiny else {}))  # gpt2: 768, 12 layers
    return LastHidden(GPT2Model(config)), (_ids(batch, seq, config.vocab_size),)


def build_t5_encoder(batch: int, tiny: bool) -> tuple[nn.Module, Inputs]:
    from transformers import T5Config, T5EncoderModel

    seq = 16 if tiny else 128
    small = dict(d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2)
    config = T5Config(use_cache=False, **(small if tiny else {}))  # t5-small: 512, 6 layers
    return LastHidden(T5EncoderModel(config)), (_ids(batch, seq, config.vocab_size),)


def build_mlp_b1(batch: int, tiny: bool) -> tuple[nn.Module, Inputs]:
    """Launch-bound: 24 small Linear+GELU layers at batch 1 (4 layers of 32 when tiny)."""
    dim, depth = (32, 4) if tiny else (256, 24)
    layers: list[nn.Module] = []
    for _ in itertools.repeat(None, depth):
        layers += [nn.Linear(dim, dim), nn.GELU()]
    return nn.Sequential(*layers), (torch.randn(batch, dim),)


class DecodeStep(nn.Module):
    """One generation step of a causal LM: one new token against a KV cache of past tokens.

    Takes the token ids and the cache as flat tensors (keys and values per layer) and
    returns the logits and the grown cache, flat: tensors in, tensors out, as a serving
    loop calls it (a graph per cache length; each call's cache is fresh memory)."""

    def __init__(self, model: nn.Module, layers: int) -> None:
        super().__init__()
        self.model = model
        self.layers = layers

    def forward(self, ids: torch.Tensor, *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from transformers import DynamicCache

        pairs = [(past[2 * i], past[2 * i + 1]) for i in range(self.layers)]
        out = self.model(ids, DynamicCache(pairs), use_cache=True)  # 2nd: the cache (4.x, 5.x)
        cache = out.cache if "cache" in out else out.past_key_values  # 5.x, 4.x
        if hasattr(cache, "layers"):  # transformers 5
            grown = [t for layer in cache.layers for t in (layer.keys, layer.values)]
        else:
            grown = [
                t for i in range(self.layers) for t in (cache.key_cache[i], cache.value_cache[i])
            ]
        return (out.logits, *grown)


def build_gpt2_decode(batch: int, tiny: bool) -> tuple[nn.Module, Inputs]:
    """Launch-bound: a GPT-2 of 4 layers of 256 (vocabulary 8192) decoding one token
    against 63 cached ones (2 layers of 32, 7 cached, when tiny)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    dim, layers, heads, vocab, past = (32, 2, 2, 256, 7) if tiny else (256, 4, 4, 8192, 63)
    config = GPT2Config(
        n_embd=dim, n_layer=layers, n_head=heads, vocab_size=vocab, n_positions=256,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    cache = [torch.randn(batch, heads, past, dim // heads) for _ in range(2 * layers)]
    return DecodeStep(GPT2LMHeadModel(config), layers), (_ids(batch, 1, vocab), *cache)


REAL_SUITE: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            "resnet50",
            timm_builder("resnet50", {}, 224, 32),
            16,
            "timm resnet50, 224x224",
            TIMM,
        ),
        ModelSpec(
            "vit_base_patch16_224",
            timm_builder(
                "vit_base_patch16_224",
                {"img_size": 32, "depth": 2, "embed_dim": 64, "num_heads": 2},
                224,
                32,
            ),
            16,
            "timm vit_base_patch16_224",
            TIMM,
        ),
        ModelSpec(
            "convnext_tiny",
            timm_builder(
                "convnext_tiny", {"depths": (1, 1, 1, 1), "dims": (16, 32, 64, 128)}, 224, 32
            ),
            16,
            "timm convnext_tiny, 224x224",
            TIMM,
        ),
        ModelSpec(
            "bert", build_bert, 8, "transformers BertModel, bert-base config, 8x128", TRANSFORMERS
        ),
        ModelSpec(
            "gpt2", build_gpt2, 8, "transformers GPT2Model, gpt2 config, 8x128", TRANSFORMERS
        ),
        ModelSpec(
            "t5_encoder",
            build_t5_encoder,
            8,
            "transformers T5EncoderModel, t5-small config, 8x128",
            TRANSFORMERS,
        ),
        ModelSpec("mlp_b1", build_mlp_b1, 1, "launch-bound MLP, 24 layers of 256, batch 1"),
        ModelSpec(
            "gpt2_decode",
            build_gpt2_decode,
            1,
            "transformers GPT-2 (4 layers of 256) decode step, 1 token against 63 cached, batch 1",
            TRANSFORMERS,
        ),
    )
}
QUICK_REAL_MODELS = tuple(REAL_SUITE)  # every architecture, in its tiny form
