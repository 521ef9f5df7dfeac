"""Mixed-length traffic through the chain with and without per-shape buckets (chain.buckets).

    python benchmarks/shape_buckets.py [--calls 400] [--rounds 3] [--threads 1]

A tiny BertModel (chain.bench.zoo) gets batch-2 requests whose lengths follow a log-normal
distribution (median ~16 tokens, clipped to 4..60; fixed seed), so a few lengths are hot
and many are cold, as in real text traffic. Two chains of `inductor, eager`: one with
`bucket_after=None` (the general, dynamic-shape inductor graph serves every length) and
one with buckets (static inductor, compiled per hot length, serves the lengths where it
wins). A warm-up pass compiles everything; then `--rounds` timed passes of the same
traffic, the two chains alternating; per-call latency: median of each pass, then the
median over passes. Eager (uncompiled) is timed alongside.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chain import chain
from chain.bench import zoo


def traffic(calls: int, seed: int = 0) -> list[torch.Tensor]:
    """`calls` batch-2 token tensors, lengths log-normal around 16, clipped to 4..60."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.exp(torch.randn(calls, generator=g) * 0.45 + 2.77).round().clamp(4, 60)
    return [torch.randint(0, zoo.VOCAB, (2, int(n)), generator=g) for n in lengths]


def per_call_ms(fn: Callable[..., Any], requests: list[torch.Tensor]) -> float:
    """The median latency of one pass over `requests`."""
    times = []
    for x in requests:
        start = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bucket-after", type=int, default=8)
    parser.add_argument("--max-buckets", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args()
    if (why := zoo.available()) is not None:
        sys.exit(why)
    torch.set_num_threads(args.threads)
    model = zoo.build("bert")
    requests = traffic(args.calls)
    counts = collections.Counter(int(x.shape[1]) for x in requests)
    print(f"{args.calls} requests, {len(counts)} lengths; hottest: {counts.most_common(6)}")
    plain = chain("inductor", "eager", bucket_after=None, measure_budget_s=0.1)
    bucketed = chain(
        "inductor", "eager", bucket_after=args.bucket_after, max_buckets=args.max_buckets,
        measure_budget_s=0.1,
    )  # fmt: skip
    candidates: dict[str, Callable[..., Any]] = {
        "eager (no compile)": model,
        "chain, no buckets": torch.compile(model, backend=plain),
        "chain, buckets": torch.compile(model, backend=bucketed),
    }
    with torch.no_grad():
        for name, fn in candidates.items():
            start = time.perf_counter()
            per_call_ms(fn, requests)  # warm-up pass: compiles (and builds the buckets)
            print(f"warm-up pass, {name}: {time.perf_counter() - start:.1f} s")
        samples: dict[str, list[float]] = {name: [] for name in candidates}
        for r in range(args.rounds):
            names = list(candidates)
            for name in names[r % 3 :] + names[: r % 3]:
                samples[name].append(per_call_ms(candidates[name], requests))
    eager = statistics.median(samples["eager (no compile)"])
    print(f"\nBertModel (tiny), {torch.get_num_threads()} torch thread(s), median ms/call")
    for name, values in samples.items():
        ms = statistics.median(values)
        print(f"{name:22} {ms:8.3f} ms  {eager / ms:5.2f}x over eager  ({values})")
    for graph in bucketed.report.graphs:
        if graph.buckets is not None:
            print(f"\ngraph {graph.id} buckets ({graph.winner} general path):")
            for bucket in graph.buckets.buckets:
                print(f"  {bucket}")


if __name__ == "__main__":
    main()
