"""Small causal language models for text generation: GPT-2 and Llama from configs.

Random weights, nothing downloaded, eval mode. `generate()` with them is greedy and uses
the KV cache (`GREEDY`): the prefill graph reads the prompt, each decode step one token
against a cache that grows by one every step, which is why people compile them with
`dynamic=True`. Used by `benchmarks/generate.py` and the generation tests.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from chain.bench.real_models import TRANSFORMERS

VOCAB = 100
PAD = 0
MODELS = ("gpt2", "llama")
available = TRANSFORMERS  # why these models cannot be built here (None: they can)


def greedy(new_tokens: int) -> dict[str, Any]:
    """`generate()`'s keywords: greedy, the KV cache on, exactly `new_tokens` new tokens."""
    return {
        "max_new_tokens": new_tokens,
        "min_new_tokens": new_tokens,
        "do_sample": False,
        "use_cache": True,
        "pad_token_id": PAD,
    }


def build(name: str, size: str = "tiny") -> nn.Module:
    """The causal LM `name` (gpt2 or llama), seeded, in eval mode; `size` "tiny" (2 layers
    of 32) or "small" (4 layers of 128)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    dim, layers, heads = {"tiny": (32, 2, 4), "small": (128, 4, 4)}[size]
    torch.manual_seed(0)
    tokens = {"bos_token_id": PAD, "eos_token_id": PAD, "pad_token_id": PAD}
    if name == "gpt2":
        config = GPT2Config(
            vocab_size=VOCAB, n_embd=dim, n_layer=layers, n_head=heads, n_positions=256,
            **tokens,
        )  # fmt: skip
        return GPT2LMHeadModel(config).eval()
    if name == "llama":
        config = LlamaConfig(
            vocab_size=VOCAB, hidden_size=dim, intermediate_size=2 * dim,
            num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads // 2,
            max_position_embeddings=256, **tokens,
        )  # fmt: skip
        return LlamaForCausalLM(config).eval()
    raise ValueError(f"unknown model {name!r}; one of {', '.join(MODELS)}")


def prompt(batch: int, length: int = 6, seed: int = 0) -> torch.Tensor:
    """Token ids (no padding token among them), seeded."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(PAD + 1, VOCAB, (batch, length), generator=generator)
