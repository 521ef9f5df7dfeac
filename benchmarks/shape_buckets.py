"""Mixed-length traffic through the chain with and without per-shape buckets (chain.run.buckets).

    python benchmarks/shape_buckets.py [--calls 400] [--rounds 3] [--threads 1] [--hogs 2]

A tiny BertModel (chain.bench.zoo) gets batch-2 requests whose lengths follow a log-normal
distribution (median ~16 tokens, clipped to 4..60; fixed seed), so a few lengths are hot
and many are cold, as in real text traffic. Two chains of `inductor, eager`: one with
`bucket_after=None` (the general, dynamic-shape inductor graph serves every length) and
one with buckets (static inductor, compiled per hot length, serves the lengths where it
wins). A warm-up pass compiles everything; inductor's packages, built in the background
once a decision is kept, are waited for (one that times faster serves the general path,
and the buckets timed against the JIT compile are decided again), and a second warm-up
pass rebuilds what that retired. Then `--rounds` timed passes of the same traffic, the two
chains alternating; per-call latency: median of each pass, then the
median over passes. Eager (uncompiled) is timed alongside. Then the hot calls bucketed: of
the timed passes' calls at a length that got a bucket built in the warm-up (whatever it
decided), how many a bucket served. `--hogs N` runs N CPU-hog processes (benchmarks/load.py)
from before the first compile to the end: a busy machine, where a bucket's timing is noisy
and the run-time race (chain.run.buckets.racing) decides it.

    python benchmarks/shape_buckets.py --device cuda [--model base] [--dtype fp16]

On a GPU (exits at once with the reason where there is none): the model in fp16 on CUDA,
and the variants where fixed shapes pay: `inductor, eager` without buckets; buckets whose
fixed-shape candidate is `cudagraphs` (one CUDA graph per hot length); buckets over the
`cuda_graphs` stage (`inductor+graphs` per hot length); and torch.compile's own `inductor`
mode="reduce-overhead" (cudagraph trees, one graph per length, unbounded). `--model base`
is a BERT-base config (12 layers, hidden 768), random weights, nothing downloaded.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.load import Hogs
from chain import chain
from chain.bench import zoo
from chain.select import deferred


def traffic(calls: int, seed: int = 0) -> list[torch.Tensor]:
    """`calls` batch-2 token tensors, lengths log-normal around 16, clipped to 4..60."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.exp(torch.randn(calls, generator=g) * 0.45 + 2.77).round().clamp(4, 60)
    return [torch.randint(0, zoo.VOCAB, (2, int(n)), generator=g) for n in lengths]


def per_call_ms(fn: Callable[..., Any], requests: list[torch.Tensor]) -> float:
    """The median latency of one pass over `requests` (CUDA synchronized per call)."""
    cuda = requests[0].is_cuda
    times = []
    for x in requests:
        start = time.perf_counter()
        fn(x)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def device_error(device: str) -> str | None:
    """Why `device` cannot run this benchmark here, or None."""
    if device == "cuda" and not torch.cuda.is_available():
        return (
            "shape_buckets: --device cuda needs a CUDA device, and there is none here "
            "(torch.cuda.is_available() is False); run without --device on CPU"
        )
    return None


def build_model(name: str) -> torch.nn.Module:
    """The tiny BERT of chain.bench.zoo, or a BERT-base config with random weights."""
    if name == "tiny":
        return zoo.build("bert")
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    return BertModel(BertConfig()).eval()


def variants(args: argparse.Namespace, model: torch.nn.Module) -> dict[str, Any]:
    """name -> (callable, its chain or None): what the benchmark times on this device."""
    buckets = {"bucket_after": args.bucket_after, "max_buckets": args.max_buckets}
    budget = {"measure_budget_s": 0.1}
    first = args.general
    plain = chain(first, "eager", bucket_after=None, **budget)
    out: dict[str, Any] = {"eager (no compile)": (model, None)}
    out["chain, no buckets"] = (torch.compile(model, backend=plain), plain)
    if args.device == "cpu":
        bucketed = chain(first, "eager", **buckets, **budget)
        out["chain, buckets"] = (torch.compile(model, backend=bucketed), bucketed)
        return out
    graphs = chain("inductor", "cudagraphs", "eager", cuda_graphs=False, **buckets, **budget)
    out["chain, buckets: cudagraphs"] = (torch.compile(model, backend=graphs), graphs)
    staged = chain("inductor", "eager", cuda_graphs=True, **buckets, **budget)
    out["chain, buckets: inductor+graphs"] = (torch.compile(model, backend=staged), staged)
    out["inductor reduce-overhead"] = (torch.compile(model, mode="reduce-overhead"), None)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bucket-after", type=int, default=8)
    parser.add_argument("--max-buckets", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--model", choices=("tiny", "base"), default="tiny")
    parser.add_argument("--dtype", choices=("fp32", "fp16"), default=None,
                        help="default: fp16 on cuda, fp32 on cpu")  # fmt: skip
    parser.add_argument("--hogs", type=int, default=0, help="CPU-hog processes meanwhile")
    parser.add_argument("--general", choices=("inductor", "onnxruntime"), default="inductor",
                        help="the chain's first backend (on cpu): the general path, and "
                        "compiled per hot length, the bucket's candidate")  # fmt: skip
    args = parser.parse_args()
    if (why := device_error(args.device) or zoo.available()) is not None:
        sys.exit(why)
    print(f"load average at the start: {os.getloadavg()}; {args.hogs} hog(s)")
    with Hogs(args.hogs):
        run(args)
    print(f"load average at the end: {os.getloadavg()}")


def bucket_calls(used: Any) -> dict[str, tuple[int, float | None]]:
    """Per shape that got a bucket: the calls its bucket served so far, and the build
    timing's speedup (the general path's time over the bucket's: under 1, the bucket was
    measured slower)."""
    buckets = [b for g in used.report.graphs if g.buckets for b in g.buckets.buckets]
    return {b.shape: (b.calls, b.speedup) for b in buckets}


def length_of(shape: str) -> int:
    """The sequence length in a bucket's shape text, `s41=13, l_inputs_0_ (2, 13)`: 13."""
    return int(shape.split("(")[-1].split(",")[1].strip(" )"))


def hot_calls(
    before: dict[str, tuple[int, float | None]],
    after: dict[str, tuple[int, float | None]],
    lengths: list[int],
    rounds: int,
    faster: bool | None = None,
) -> tuple[int, int]:
    """(bucketed, hot): of the timed passes' calls (`lengths` per pass, `rounds` passes) at a
    length whose bucket was built in the warm-up (`before`), how many a bucket served.
    `faster`: only the lengths whose build timing put the bucket faster (True) or not
    faster (False) than the general path; None: all of them."""
    shapes = {
        s: sp
        for s, (_, sp) in before.items()
        if faster is None or (sp is not None and sp >= 1.0) == faster
    }
    hot = rounds * sum(n in {length_of(s) for s in shapes} for n in lengths)
    bucketed = sum(after.get(s, (0, None))[0] - before[s][0] for s in shapes)
    return bucketed, hot


def run(args: argparse.Namespace) -> None:
    """Warm-up pass, timed passes, figures (see the module's docstring)."""
    torch.set_num_threads(args.threads)
    dtype = args.dtype or ("fp16" if args.device == "cuda" else "fp32")
    model = build_model(args.model).to(args.device)
    if dtype == "fp16":
        model = model.half()
    requests = [x.to(args.device) for x in traffic(args.calls)]
    counts = collections.Counter(int(x.shape[1]) for x in requests)
    print(f"{args.calls} requests, {len(counts)} lengths; hottest: {counts.most_common(6)}")
    candidates = variants(args, model)
    with torch.no_grad():
        for name, (fn, _) in candidates.items():
            start = time.perf_counter()
            per_call_ms(fn, requests)  # warm-up pass: compiles (and builds the buckets)
            print(f"warm-up pass, {name}: {time.perf_counter() - start:.1f} s")
        # inductor's packages build in the background once a decision is kept, and serve
        # this process when faster (its buckets are then decided again): the steady state
        # comes after them, and a second pass that rebuilds what they retired
        start = time.perf_counter()
        finished = deferred.wait(600)
        print(f"background builds: {'done' if finished else 'still running'} after "
              f"{time.perf_counter() - start:.1f} s")  # fmt: skip
        for name, (fn, _) in candidates.items():
            start = time.perf_counter()
            per_call_ms(fn, requests)
            print(f"second warm-up pass, {name}: {time.perf_counter() - start:.1f} s")
        built = {n: bucket_calls(u) for n, (_, u) in candidates.items() if u is not None}
        samples: dict[str, list[float]] = {name: [] for name in candidates}
        for r in range(args.rounds):
            names = list(candidates)
            k = r % len(names)
            for name in names[k:] + names[:k]:
                samples[name].append(per_call_ms(candidates[name][0], requests))
    eager = statistics.median(samples["eager (no compile)"])
    where = (
        torch.cuda.get_device_name()
        if args.device == "cuda"
        else f"{torch.get_num_threads()} torch thread(s)"
    )
    print(f"\nBertModel ({args.model}, {dtype}), {where}, median ms/call")
    for name, values in samples.items():
        ms = statistics.median(values)
        print(f"{name:34} {ms:8.3f} ms  {eager / ms:5.2f}x over eager  ({values})")
    lengths = [int(x.shape[1]) for x in requests]
    for name, before in built.items():
        if not before:
            continue
        after = bucket_calls(candidates[name][1])
        done, hot = hot_calls(before, after, lengths, args.rounds)
        print(f"\n{name}: hot calls bucketed {done} of {hot} ({done / max(hot, 1):.0%}), "
              f"{len(before)} hot length(s)")  # fmt: skip
        for faster, what in ((True, "faster"), (False, "slower")):
            done, hot = hot_calls(before, after, lengths, args.rounds, faster)
            count = sum((sp is not None and sp >= 1.0) == faster for _, sp in before.values())
            print(f"  at the {count} length(s) whose build timing put the bucket {what} than "
                  f"the general path: {done} of {hot} bucketed")  # fmt: skip
    for name, (_, used) in candidates.items():
        for graph in used.report.graphs if used is not None else ():
            for note in graph.notes:  # which form serves the general path: package or JIT
                if "package" in note:
                    print(f"{name}: graph {graph.id} ({graph.winner}): {note}")
            if graph.buckets is not None:
                print(f"\n{name}: graph {graph.id} buckets ({graph.winner} general path):")
                for bucket in graph.buckets.buckets:
                    print(f"  {bucket}")


if __name__ == "__main__":
    main()
