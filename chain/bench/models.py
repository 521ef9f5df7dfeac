"""The benchmark's model suite: common model shapes built from code with random weights.

`SUITE[name].build(batch_size, device, dtype)` returns a model in eval mode and its
inputs, seeded. Default sizes keep the full CPU run to a few minutes on 2 cores; `tiny`
sizes keep the `--quick` smoke run well under a minute. Nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

Inputs = tuple[torch.Tensor, ...]
Builder = Callable[[int, bool], tuple[nn.Module, Inputs]]  # (batch size, tiny)


class BasicBlock(nn.Module):
    """A ResNet basic block: two 3x3 convolutions with batch norm and a skip connection."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.skip: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.skip = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(h)) + self.skip(x))


class ResNet(nn.Module):
    """A small ResNet: a stem, one basic block per stage, global pooling, a linear head."""

    def __init__(self, widths: tuple[int, ...], classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()
        )
        blocks = [
            BasicBlock(widths[max(i - 1, 0)], w, 1 if i == 0 else 2) for i, w in enumerate(widths)
        ]
        self.stages = nn.Sequential(*blocks)
        self.head = nn.Linear(widths[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stages(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))


class Block(nn.Module):
    """A transformer layer: multi-head attention (optionally causal) and a GELU MLP."""

    def __init__(self, dim: int, heads: int, causal: bool = False, pre_norm: bool = True) -> None:
        super().__init__()
        self.heads, self.causal, self.pre_norm = heads, causal, pre_norm
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def attend(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal)
        return self.proj(out.transpose(1, 2).reshape(b, s, d))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.attend(self.norm1(x), mask)
            return x + self.mlp(self.norm2(x))
        x = self.norm1(x + self.attend(x, mask))
        return self.norm2(x + self.mlp(x))


class Encoder(nn.Module):
    """BERT-style: token + position embeddings, post-norm layers, padding mask, tanh pooler."""

    def __init__(self, vocab: int, dim: int, heads: int, layers: int, seq: int) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.norm = nn.LayerNorm(dim)
        self.layers = nn.ModuleList(Block(dim, heads, pre_norm=False) for _ in range(layers))
        self.pooler = nn.Linear(dim, dim)

    def forward(
        self, ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(ids.shape[1], device=ids.device)
        h = self.norm(self.tokens(ids) + self.positions(pos))
        mask = attention_mask[:, None, None, :].bool()
        for layer in self.layers:
            h = layer(h, mask)
        return h, torch.tanh(self.pooler(h[:, 0]))


class Decoder(nn.Module):
    """GPT-style: causal pre-norm layers and a language-model head tied to the embedding."""

    def __init__(self, vocab: int, dim: int, heads: int, layers: int, seq: int) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.layers = nn.ModuleList(Block(dim, heads, causal=True) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        h = self.tokens(ids) + self.positions(pos)
        for layer in self.layers:
            h = layer(h)
        return self.norm(h) @ self.tokens.weight.t()


class ViT(nn.Module):
    """ViT-style: patch embedding by convolution, a class token, pre-norm layers, a head."""

    def __init__(
        self, image: int, patch: int, dim: int, heads: int, layers: int, classes: int = 10
    ) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
        self.layers = nn.Sequential(*(Block(dim, heads) for _ in range(layers)))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.patch(x).flatten(2).transpose(1, 2)
        h = torch.cat([self.cls.expand(h.shape[0], -1, -1), h], dim=1) + self.pos
        return self.head(self.norm(self.layers(h))[:, 0])


def mlp(dims: tuple[int, ...]) -> nn.Sequential:
    """Linear layers with GELU between them."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(dims)):
        layers += [nn.Linear(a, b)] + ([nn.GELU()] if i < len(dims) - 2 else [])
    return nn.Sequential(*layers)


class TwoStage(nn.Module):
    """A conv encoder, an explicit graph break, then an MLP head: dynamo hands over 2 graphs."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Conv2d(3, width, 3, 2, 1), nn.BatchNorm2d(width), nn.ReLU())
        self.head = mlp((width, hidden, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x).mean(dim=(2, 3))
        torch._dynamo.graph_break()
        return self.head(h)


def _ids(batch: int, seq: int, vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq))


def build_resnet(batch: int, tiny: bool) -> tuple[nn.Module, Inputs]:
    size, widths = (16, (8, 16)) if tiny else (32, (16, 32, 64))
    return ResNet(widths), (torch.randn(batch, 3, size, size),)


def build_bert(batch: int, tiny: bool) -> tuple[nn.Module, Inputs]:
    vocab, dim, layers, seq = (100, 32, 1, 16) if tiny else (1000, 128, 2, 64)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[:, seq * 3 // 4 :] = 0  # padding at the end, as a real batch has
    return Encoder(vocab, dim, 4, layers, seq), (_ids(batch, seq, vocab), mask)


def build_gpt(batch: int, tiny: bool) -> tuple[nn.Module, Inputs]:
    vocab, dim, layers, seq = (100, 32, 1, 16) if tiny else (1000, 128, 2, 64)
    return Decoder(vocab, dim, 4, layers, seq), (_ids(batch, seq, vocab),)


def build_vit(batch: int, tiny: bool) -> tuple[nn.Module, Inputs]:
    image, dim, layers = (16, 32, 1) if tiny else (32, 128, 2)
    return ViT(image, 4, dim, 4, layers), (torch.randn(batch, 3, image, image),)


def build_mlp(batch: int, tiny: bool) -> tuple[nn.Module, Inputs]:
    dims = (64, 128, 10) if tiny else (512, 1024, 1024, 10)
    return mlp(dims), (torch.randn(batch, dims[0]),)


def build_graph_break(batch: int, tiny: bool) -> tuple[nn.Module, Inputs]:
    width, hidden, size = (8, 32, 16) if tiny else (32, 256, 32)
    return TwoStage(width, hidden), (torch.randn(batch, 3, size, size),)


def _transformers_reason() -> str | None:
    if importlib.util.find_spec("transformers") is None:
        return "transformers is not installed: pip install 'backend-chain[bench]'"
    return None


class TensorOutputs(nn.Module):
    """A transformers model whose output is its tensors (a tuple), not a `ModelOutput`.

    transformers 5 returns dataclass-like `ModelOutput`s; the harness, `verify.compare`
    and ONNX export want tensors. `to_tuple()` keeps the fields that are set, in order.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        out = self.model(*args)
        leaves = tuple(out.to_tuple()) if hasattr(out, "to_tuple") else tuple(out)
        return leaves[0] if len(leaves) == 1 else leaves


def build_hf_bert(batch: int, tiny: bool) -> tuple[nn.Module, Inputs]:
    from transformers import BertConfig, BertModel

    dim, layers, seq = (32, 1, 16) if tiny else (128, 2, 64)
    config = BertConfig(
        vocab_size=1000, hidden_size=dim, num_hidden_layers=layers, num_attention_heads=4,
        intermediate_size=4 * dim, max_position_embeddings=seq,
    )  # fmt: skip
    return TensorOutputs(BertModel(config)), (
        _ids(batch, seq, 1000),
        torch.ones(batch, seq, dtype=torch.long),
    )


def build_hf_gpt2(batch: int, tiny: bool) -> tuple[nn.Module, Inputs]:
    from transformers import GPT2Config, GPT2LMHeadModel

    dim, layers, seq = (32, 1, 16) if tiny else (128, 2, 64)
    config = GPT2Config(
        vocab_size=1000,
        n_embd=dim,
        n_layer=layers,
        n_head=4,
        n_positions=seq,
        use_cache=False,
        bos_token_id=999,
        eos_token_id=999,
    )
    return TensorOutputs(GPT2LMHeadModel(config)), (_ids(batch, seq, 1000),)


@dataclass(frozen=True)
class ModelSpec:
    """A named model of the suite: its builder, default batch size and availability check."""

    name: str
    builder: Builder
    batch_size: int
    doc: str
    available: Callable[[], str | None] = lambda: None

    def build(
        self, batch_size: int | None, device: torch.device, dtype: torch.dtype, tiny: bool = False
    ) -> tuple[nn.Module, Inputs]:
        """The model (seeded random weights, eval mode, on device in dtype) and its inputs."""
        torch.manual_seed(0)
        model, inputs = self.builder(batch_size or self.batch_size, tiny)
        moved = tuple(x.to(device, dtype if x.is_floating_point() else x.dtype) for x in inputs)
        return model.to(device=device, dtype=dtype).eval(), moved


SUITE: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("resnet", build_resnet, 8, "ResNet-like CNN, 32x32 images"),
        ModelSpec("bert", build_bert, 8, "BERT-style encoder with a padding mask, seq 64"),
        ModelSpec("gpt", build_gpt, 8, "GPT-style decoder, causal attention, seq 64"),
        ModelSpec("vit", build_vit, 8, "ViT-style model, 4x4 patches of 32x32 images"),
        ModelSpec("mlp", build_mlp, 64, "MLP 512-1024-1024-10"),
        ModelSpec("graph_break", build_graph_break, 8, "conv encoder | graph break | MLP head"),
        ModelSpec(
            "hf_bert",
            build_hf_bert,
            8,
            "transformers BertModel, small config",
            _transformers_reason,
        ),
        ModelSpec(
            "hf_gpt2",
            build_hf_gpt2,
            8,
            "transformers GPT2LMHeadModel, small config",
            _transformers_reason,
        ),
    )
}
QUICK_MODELS = ("mlp", "resnet")


def default_models() -> list[str]:
    """Every model of the suite that can be built here (the transformers ones only if installed)."""
    return [name for name, spec in SUITE.items() if spec.available() is None]
