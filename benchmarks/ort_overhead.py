"""How close the onnxruntime backend gets to ONNX Runtime itself, per model family.

For a ResNet-like CNN, a BERT-style encoder and a ViT-style model (random weights, built
from code), the median latency of: eager; `torch.compile(m, backend="eager")` (the fixed
cost every dynamo backend pays per call); `torch.compile(m, backend=<our ORT backend>)`;
`runner` (our compiled callable called without dynamo); the chain
`chain("onnxruntime", "eager")`; and ONNX Runtime on the model exported directly with
`torch.onnx.export`, with the same session options; and `dynamo+direct`, that same direct
ORT call returned by a `torch.compile` backend: dynamo's own per-call cost (guards over every
parameter input, frame handling) under the same cache pressure as ours. `ours/dyn+dir` is
therefore the backend's own overhead; `dynamo fixed` is dynamo+direct minus direct.

All variants run in one process, interleaved: each round, every variant makes one untimed
call (so it is not charged for the previous variant's cache or threads), then `--calls`
timed calls; the table shows the median over `--rounds` rounds.

    python benchmarks/ort_overhead.py [--rounds 40] [--calls 5] [--threads N] [--spin]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends import lookup_backend
from backends.common.onnx_export import quiet
from backends.onnxruntime.session import session_options


class Block(nn.Module):
    """A ResNet basic block: two 3x3 convs with batch norm and a residual."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.skip = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.b2(self.c2(F.relu(self.b1(self.c1(x))))) + self.skip(x))


class ResNetish(nn.Module):
    def __init__(self, widths: tuple[int, ...] = (32, 64, 128), classes: int = 100) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1), nn.BatchNorm2d(widths[0]))
        blocks, cin = [], widths[0]
        for i, w in enumerate(widths):
            blocks += [Block(cin, w, 1 if i == 0 else 2), Block(w, w, 1)]
            cin = w
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blocks(F.relu(self.stem(x)))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))


class BertLayer(nn.Module):
    """BERT's layer spelled out as BERT implementations do: q/k/v linears, post-norm."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, n, self.heads, d // self.heads).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads) + mask
        ctx = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, n, d)
        x = self.ln1(x + self.o(ctx))
        return self.ln2(x + self.down(F.gelu(self.up(x))))


class Bert(nn.Module):
    def __init__(self, vocab: int = 8000, dim: int = 256, heads: int = 4, depth: int = 4) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(512, dim)
        self.ln = nn.LayerNorm(dim)
        self.layers = nn.ModuleList(BertLayer(dim, heads) for _ in range(depth))
        self.pool = nn.Linear(dim, dim)

    def forward(self, ids: torch.Tensor, attention: torch.Tensor) -> tuple[torch.Tensor, ...]:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.ln(self.tok(ids) + self.pos(positions))
        mask = (1.0 - attention[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.layers:
            x = layer(x, mask)
        return x, torch.tanh(self.pool(x[:, 0]))


class ViT(nn.Module):
    """Patch embedding, class token, nn.TransformerEncoder (its fused fast path), head."""

    def __init__(self, image: int = 64, patch: int = 8, dim: int = 256, depth: int = 4) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, dim, patch, patch)
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(
            dim, 4, 4 * dim, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, 100)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        return self.head(self.norm(self.encoder(x))[:, 0])


def models() -> dict[str, tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    ids = torch.randint(0, 8000, (2, 64))
    return {
        "resnet": (ResNetish().eval(), (torch.randn(4, 3, 32, 32),)),
        "bert": (Bert(depth=2).eval(), (ids, torch.ones(2, 64, dtype=torch.int64))),
        "vit": (ViT(image=32, patch=4, depth=2).eval(), (torch.randn(2, 3, 32, 32),)),
    }


def direct_ort(
    model: nn.Module, args: tuple[torch.Tensor, ...], threads: int | None, spin: bool
) -> Callable:
    """ONNX Runtime on the model exported directly; same session options as the backend."""
    import onnxruntime as ort

    with quiet():
        program = torch.onnx.export(model, args, dynamo=True, verbose=False, report=False)
    options = session_options("all", threads, spin)
    session = ort.InferenceSession(
        program.model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    names = [i.name for i in session.get_inputs()]

    def run(*xs: torch.Tensor) -> Any:
        outs = session.run(None, {n: x.numpy() for n, x in zip(names, xs, strict=True)})
        return [torch.from_numpy(o) for o in outs]

    return run


def variants(
    model: nn.Module, args: tuple[torch.Tensor, ...], threads: int | None, spin: bool
) -> dict[str, Callable]:
    ort_backend = lookup_backend("onnxruntime")
    options: dict[str, Any] = {"allow_spinning": spin}
    if threads is not None:
        options["intra_op_num_threads"] = threads

    built: list[tuple[Callable, list[Any]]] = []

    def ours(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
        runner = ort_backend(gm, example_inputs, **options)
        built.append((runner, list(example_inputs)))
        return runner

    compiled = torch.compile(model, backend=ours)
    compiled(*args)
    if len(built) != 1:
        raise RuntimeError(f"expected one graph, dynamo made {len(built)}")
    runner, inputs = built[0]
    found: dict[str, Callable] = {
        "eager": model,
        "compile(eager)": torch.compile(model, backend="eager"),
        "compile(ort)": compiled,
        "runner": lambda *_: runner(*inputs),  # our callable alone, without dynamo's cost
    }
    try:
        from chain import chain
    except ImportError:
        chain = None
    if chain is not None:
        b = chain("onnxruntime", "eager", options={"onnxruntime": options})
        found["chain(ort)"] = torch.compile(model, backend=b)
    direct = direct_ort(model, args, threads, spin)
    found["direct ort"] = direct

    def through_dynamo(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
        return lambda *_: direct(*args)  # dynamo's guards and frame handling around direct ORT

    found["dynamo+direct"] = torch.compile(model, backend=through_dynamo)
    return found


def bench(rounds: int, calls: int, threads: int | None, spin: bool) -> list[dict[str, Any]]:
    rows = []
    for name, (model, args) in models().items():
        with torch.no_grad():
            runs = variants(model, args, threads, spin)
            for fn in runs.values():  # compile + warm up
                for _ in range(3):
                    fn(*args)
            times: dict[str, list[float]] = {k: [] for k in runs}
            for _ in range(rounds):
                for key, fn in runs.items():
                    fn(*args)  # untimed: the previous variant's caches and spinning threads
                    start = time.perf_counter()
                    for _ in range(calls):
                        fn(*args)
                    times[key].append((time.perf_counter() - start) * 1e3 / calls)
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append({"model": name, **med})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=5, help="timed calls per variant per round")
    parser.add_argument(
        "--threads", type=int, default=None, help="ORT intra-op threads and torch threads"
    )
    parser.add_argument("--spin", action="store_true", help="let ORT's idle threads spin")
    ns = parser.parse_args()
    if ns.threads is not None:
        torch.set_num_threads(ns.threads)
    rows = bench(ns.rounds, ns.calls, ns.threads, ns.spin)
    keys = [k for k in rows[0] if k != "model"]
    print(
        f"median ms per call over {ns.rounds} interleaved rounds of {ns.calls} calls "
        f"(after one untimed call), torch threads {torch.get_num_threads()}, "
        f"ORT intra-op threads {ns.threads or 'default'}, spinning {'on' if ns.spin else 'off'}"
    )
    header = ["model", *keys, "dynamo fixed", "runner/direct", "ours/direct", "ours/dyn+dir"]
    if "chain(ort)" in keys:
        header.append("chain/direct")
    print(" | ".join(f"{h:>14}" for h in header))
    for row in rows:
        cells = [row["model"], *(f"{row[k]:.3f}" for k in keys)]
        cells.append(f"{row['dynamo+direct'] - row['direct ort']:+.3f}")
        cells.append(f"{row['runner'] / row['direct ort']:.3f}")
        cells.append(f"{row['compile(ort)'] / row['direct ort']:.3f}")
        cells.append(f"{row['compile(ort)'] / row['dynamo+direct']:.3f}")
        if "chain(ort)" in row:
            cells.append(f"{row['chain(ort)'] / row['direct ort']:.3f}")
        print(" | ".join(f"{c:>14}" for c in cells))


if __name__ == "__main__":
    main()
