"""`python -m chain demo`: a small real model through the default chain, and its report.

On the machine it runs on: CUDA in float16 when a device is there, else the CPU in
float32; a tiny transformers BERT when transformers is installed, else a ResNet-style CNN.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

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


class TextClassifier(nn.Module):
    """A tiny BERT (transformers, from a config: random weights, nothing downloaded) and a
    classification head; a graph break between them, as a logging call would make."""

    def __init__(self, classes: int = 4) -> None:
        super().__init__()
        from transformers import BertConfig, BertModel

        config = BertConfig(
            vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128, max_position_embeddings=SEQ,
        )  # fmt: skip
        self.encoder = BertModel(config)
        self.head = nn.Linear(64, classes)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        torch._dynamo.graph_break()
        return self.head(hidden[:, 0])


SEQ = 32
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def choose_device(device: str, dtype: str, cuda: bool) -> tuple[torch.device, torch.dtype]:
    """`auto`: CUDA in float16 when a device is there (what users run on a GPU), else CPU fp32."""
    if device == "auto":
        device = "cuda" if cuda else "cpu"
    if device == "cuda" and not cuda:
        raise ValueError("--device cuda: no CUDA device here (torch.cuda.is_available() is False)")
    if dtype == "auto":
        dtype = "float16" if device == "cuda" else "float32"
    if device == "cpu" and dtype != "float32":
        raise ValueError(f"--dtype {dtype} on cpu: the demo runs float32 there")
    return torch.device(device), DTYPES[dtype]


def choose_model(name: str) -> str:
    """`auto`: the transformers model when transformers imports, else the ResNet-style one."""
    if name != "auto":
        return name
    return "bert" if importlib.util.find_spec("transformers") is not None else "resnet"


def build(name: str, device: torch.device, dtype: torch.dtype) -> tuple[nn.Module, tuple[Any, ...]]:
    """The demo model (seeded random weights, eval mode, on `device` in `dtype`) and inputs."""
    torch.manual_seed(0)
    if name == "bert":
        model: nn.Module = TextClassifier()
        ids = torch.randint(0, 1000, (8, SEQ), device=device)
        mask = torch.ones(8, SEQ, dtype=torch.long, device=device)
        mask[:, SEQ * 3 // 4 :] = 0  # padding at the end, as a real batch has
        inputs: tuple[Any, ...] = (ids, mask)
    else:
        model = TinyResNet()
        inputs = (torch.randn(8, 3, 32, 32, device=device, dtype=dtype),)
    return model.to(device=device, dtype=dtype).eval(), inputs


def describe(device: torch.device, dtype: torch.dtype) -> str:
    """One line: the device (its name on CUDA, the thread count on CPU) and the dtype."""
    if device.type == "cuda":
        where = f"cuda ({torch.cuda.get_device_name(device)})"
    else:
        where = f"cpu ({torch.get_num_threads()} threads)"
    return f"device: {where}, dtype: {str(dtype).removeprefix('torch.')}"


def error(message: str) -> int:
    """A one-line error on stderr, exit code 2 (as argparse does)."""
    print(f"chain demo: error: {message}", file=sys.stderr)
    return 2


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
    parser.add_argument(
        "--model",
        choices=("auto", "bert", "resnet"),
        default="auto",
        help="bert: a tiny transformers BERT (needs transformers); resnet: a small CNN; "
        "auto (default): bert when transformers is installed",
    )
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="auto (default): cuda when a device is there",
    )
    parser.add_argument(
        "--dtype",
        choices=("auto", *DTYPES),
        default="auto",
        help="auto (default): float16 on cuda, float32 on cpu",
    )
    parser.add_argument("--save", metavar="FILE", help="also save the report as JSON")
    args = parser.parse_args(argv)

    try:
        device, dtype = choose_device(args.device, args.dtype, torch.cuda.is_available())
        backend = chain(*args.backends, mode=args.mode)
    except ValueError as e:  # InvalidBackend, InvalidOption, no such device: one line, exit 2
        return error(str(e))
    name = choose_model(args.model)
    if name == "bert" and importlib.util.find_spec("transformers") is None:
        return error("--model bert needs transformers: pip install 'backend-chain[bench]'")
    console = Console(width=max(120, Console().width))
    model, inputs = build(name, device, dtype)
    label = "a tiny BERT (transformers) + a head" if name == "bert" else "TinyResNet"
    console.print(f"[bold]compiling {label} through {backend!r}[/bold]")
    console.print(describe(device, dtype), markup=False)
    compiled = torch.compile(model, backend=backend)
    start = time.perf_counter()
    with torch.no_grad(), console.status("trying backends graph by graph..."):
        out = compiled(*inputs)
    console.print(f"first call (compile + verify + measure): {time.perf_counter() - start:.1f}s")
    with torch.no_grad():
        err = (out - model(*inputs)).abs().max().item()
    console.print(f"max abs difference from eager: {err:.2e}")
    console.print(backend.report)  # fits the terminal (Report.__rich_console__)
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if device.type == "cpu" and load > 0.5 * cores:
        console.print(
            f"note: this machine is busy (load {load:.1f} on {cores} cores): the latencies "
            "and speedups above are noisy (torch's threads wait on each other on shared "
            "cores; chain bench --threads 1 gives steadier figures)",
            markup=False,
        )
    if args.save:
        console.print(f"saved {backend.report.save(args.save)}", markup=False)
    return 0
