"""Text generation: tokens per second of `generate()` per backend, tokens equal to eager's.

Small GPT-2 and Llama causal LMs from configs (`chain.bench.causal_lm`: random weights),
greedy with the KV cache, `--new-tokens` new tokens (32), batch 1 and 4, compiled with the
default `dynamic` and with `dynamic=True` (`model.forward = torch.compile(...)`), under
`torch.inference_mode()`. Backends: eager, `compile(backend="inductor")`, the default chain
(`backend="chain"`) and the fastest chain (`chain("onnxruntime", "inductor", "eager",
mode="fastest")`). The first call (which compiles) is timed apart; then the median of
`--repeats` calls. Every run's tokens must equal eager's, or the script fails. The chains'
winners per graph are printed under the table.

    python benchmarks/generate.py                       # everything (long on a small CPU)
    python benchmarks/generate.py --models gpt2 --batches 1 --backends eager fastest
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import chain
from chain.bench import causal_lm
from chain.dynamo import default_backends

BACKENDS = ("eager", "inductor", "chain", "fastest")
DYNAMIC: dict[str, bool | None] = {"default": None, "true": True}


def backend_for(name: str) -> tuple[Any, chain.Chain | None]:
    """The torch.compile backend for `name` and the chain behind it (for its report)."""
    if name == "inductor":
        return "inductor", None
    if name == "chain":  # what backend="chain" builds
        made = chain.chain(*default_backends())
        return made, made
    made = chain.chain("onnxruntime", "inductor", "eager", mode="fastest")
    return made, made


def timed(fn: Callable[[], torch.Tensor], repeats: int) -> tuple[float, float, torch.Tensor]:
    """(first call s, median of the next `repeats` s, the tokens of the last call)."""
    start = time.perf_counter()
    tokens = fn()
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = fn()
        times.append(time.perf_counter() - start)
    return first, statistics.median(times), tokens


def run_one(
    name: str, batch: int, dynamic: str, backend: str, new_tokens: int, repeats: int
) -> dict[str, Any]:
    """One row: tokens per second of `backend` and whether its tokens are eager's."""
    model = causal_lm.build(name)
    ids = causal_lm.prompt(batch)
    keywords = causal_lm.greedy(new_tokens)
    with torch.inference_mode():
        expected = model.generate(ids, **keywords)
    made = None
    if backend != "eager":
        torch._dynamo.reset()
        compiled_backend, made = backend_for(backend)
        model.forward = torch.compile(  # type: ignore[method-assign]
            model.forward, backend=compiled_backend, dynamic=DYNAMIC[dynamic]
        )

    def call() -> torch.Tensor:
        with torch.inference_mode():
            return model.generate(ids, **keywords)

    first, median, tokens = timed(call, repeats)
    if not torch.equal(tokens, expected):
        raise SystemExit(f"{name} batch {batch} {backend} dynamic={dynamic}: tokens differ")
    winners = [] if made is None else [str(g.winner) for g in made.report.graphs]
    return {
        "model": name,
        "batch": batch,
        "dynamic": dynamic,
        "backend": backend,
        "first_s": first,
        "tokens_per_s": batch * new_tokens / median,
        "winners": winners,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(causal_lm.MODELS))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 4])
    parser.add_argument("--dynamic", nargs="+", choices=list(DYNAMIC), default=list(DYNAMIC))
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if causal_lm.available() is not None:
        raise SystemExit(str(causal_lm.available()))
    print(f"load average at start: {os.getloadavg()}, {os.cpu_count()} CPUs", flush=True)
    rows = []
    for name in args.models:
        for batch in args.batches:
            for dynamic in args.dynamic:
                for backend in args.backends:
                    if backend == "eager" and dynamic != args.dynamic[0]:
                        continue  # eager does not compile: one row per model and batch
                    row = run_one(name, batch, dynamic, backend, args.new_tokens, args.repeats)
                    rows.append(row)
                    print(
                        f"{name:6} batch {batch} dynamic={dynamic:7} {backend:9} "
                        f"{row['tokens_per_s']:8.1f} tokens/s  first call {row['first_s']:6.1f} s"
                        f"  {' '.join(row['winners'])}",
                        flush=True,
                    )
    print(f"load average at end: {os.getloadavg()}; every run's tokens equal eager's")


if __name__ == "__main__":
    main()
