"""Small real models for tests, built from code with random weights (seeded)."""

from __future__ import annotations

import torch
from torch import nn


class SmallCNN(nn.Module):
    """Convolutions with batch norm, ReLU, pooling and a linear head."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, 16, 3, stride=2, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


class TransformerBlock(nn.Module):
    """Embedding lookup, multi-head attention, layer norm and a GELU MLP."""

    def __init__(self, vocab: int = 100, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layer = nn.TransformerEncoderLayer(
            dim,
            heads,
            dim_feedforward=4 * dim,
            activation="gelu",
            batch_first=True,
            dropout=0.0,
        )
        self.norm = nn.LayerNorm(dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.norm(self.layer(self.embed(tokens)))


class MLP(nn.Module):
    def __init__(self, dim: int = 32, hidden: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class TwoOutputs(nn.Module):
    """A tuple output: logits and a normalised feature."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(self.fc(x))
        return h, h / h.norm(dim=-1, keepdim=True)


class GraphBreak(nn.Module):
    """A print between two halves: dynamo hands over two graphs."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.a = nn.Linear(dim, dim)
        self.b = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        torch._dynamo.graph_break()
        return torch.sigmoid(self.b(h))


def build(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A model in eval mode and inputs for it, seeded so every call builds the same."""
    torch.manual_seed(0)
    model: nn.Module
    if name == "cnn":
        model, args = SmallCNN(), (torch.randn(2, 3, 16, 16),)
    elif name == "transformer":
        model, args = TransformerBlock(), (torch.randint(0, 100, (2, 8)),)
    elif name == "mlp":
        model, args = MLP(), (torch.randn(4, 32),)
    elif name == "two_outputs":
        model, args = TwoOutputs(), (torch.randn(4, 16),)
    elif name == "graph_break":
        model, args = GraphBreak(), (torch.randn(4, 16),)
    else:
        raise ValueError(f"unknown test model {name!r}")
    return model.eval(), args


MODELS = ("cnn", "transformer", "mlp", "two_outputs", "graph_break")


class LaunchBound(nn.Module):
    """Many tiny ops at batch 1: time goes to kernel launches, which CUDA graphs remove."""

    def __init__(self, depth: int = 32, dim: int = 64) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(dim, dim) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + 0.5 * torch.tanh(layer(x))
        return x


def launch_bound(device: str = "cpu") -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The launch-bound model in eval mode on `device`, with a batch-1 input (seeded)."""
    torch.manual_seed(0)
    return LaunchBound().eval().to(device), (torch.randn(1, 64, device=device),)


class KthValue(nn.Module):
    """A linear layer then `kthvalue`, which the ONNX exporter has no translation for."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.kthvalue(self.fc(x), 2, dim=-1).values


class DropoutResidual(nn.Module):
    """Residual MLP blocks with nn.Dropout and layer norm, as transformer layers are built."""

    def __init__(self, dim: int = 32, depth: int = 2) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(
                nn.Linear(dim, 2 * dim), nn.GELU(), nn.Dropout(0.1), nn.Linear(2 * dim, dim)
            )
            for _ in range(depth)
        )
        self.drop = nn.Dropout(0.1)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = self.norm(x + self.drop(block(x)))
        return x


def tiny_bert() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A transformers BertModel from a tiny config (2 layers, hidden 32), random weights."""
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    return BertModel(config), (torch.randint(0, 100, (2, 8)),)


def build_extra(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Models outside MODELS (kept out so loops over MODELS stay as they were)."""
    torch.manual_seed(0)
    if name == "kthvalue":
        return KthValue().eval(), (torch.randn(4, 16),)
    if name == "dropout_residual":
        return DropoutResidual().eval(), (torch.randn(4, 8, 32),)
    if name == "bert":
        model, args = tiny_bert()
        return model.eval(), args
    raise ValueError(f"unknown extra test model {name!r}")
