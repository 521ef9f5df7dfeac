"""`python -m chain demo`: a small real model through the default chain, and its report."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import torch
from rich.console import Console
from torch import nn


class Block(nn.Module):
    """A residual block: conv, batch norm, ReLU, twice."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.body(x))


class TinyResNet(nn.Module):
    """A ResNet-style classifier with random weights; a data-dependent print makes two graphs."""

    def __init__(self, width: int = 32, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()
        )
        self.blocks = nn.Sequential(Block(width), Block(width))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.blocks(self.stem(x))
        torch._dynamo.graph_break()  # as a logging call or a .item() would: a second graph
        return self.head(features.mean(dim=(2, 3)))


def main(argv: Sequence[str] | None = None) -> int:
    from chain import chain, default_backends

    parser = argparse.ArgumentParser(prog="chain demo", description=__doc__)
    parser.add_argument(
        "--backends",
        nargs="+",
        default=list(default_backends()),
        help=f"the chain (default: {' '.join(default_backends())})",
    )
    parser.add_argument("--mode", choices=("first", "fastest"), default="first")
    parser.add_argument("--save", metavar="FILE", help="also save the report as JSON")
    args = parser.parse_args(argv)

    console = Console(width=max(120, Console().width))
    torch.manual_seed(0)
    model = TinyResNet().eval()
    x = torch.randn(8, 3, 32, 32)
    backend = chain(*args.backends, mode=args.mode)
    console.print(f"[bold]compiling TinyResNet through {backend!r}[/bold]")
    compiled = torch.compile(model, backend=backend)
    start = time.perf_counter()
    with torch.no_grad(), console.status("trying backends graph by graph..."):
        out = compiled(x)
    console.print(f"first call (compile + verify + measure): {time.perf_counter() - start:.1f}s")
    with torch.no_grad():
        err = (out - model(x)).abs().max().item()
    console.print(f"max abs difference from eager: {err:.2e}")
    console.print(backend.report.table())
    if args.save:
        console.print(f"saved {backend.report.save(args.save)}")
    return 0
