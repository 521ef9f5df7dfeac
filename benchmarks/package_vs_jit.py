"""Per-call time of inductor's AOTInductor package against its JIT compile, side by side.

    python benchmarks/package_vs_jit.py [--models bert gpt2] [--rounds 25] [--threads 1]

Why: the chain builds the package in the background once a decision is kept
(chain.select.deferred) and serves it in place of the JIT compile when it times faster.
This shows how much that is worth per model: each zoo model (tiny configs, random weights)
exported non-strict with a dynamic sequence length, compiled with
`torch._inductor.aoti_compile_and_package`, loaded with `aoti_load_package`, and timed
against `torch.compile(backend="inductor", dynamic=True)` and eager, interleaved in rotated
order, blocks of 40 calls per round; medians, and the median of the paired per-round ratio.
Say the machine's load (printed) with any figure.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chain.bench import zoo

BLOCK = 40  # calls per timed block


def variants(name: str, folder: str) -> tuple[dict[str, Callable[..., Any]], tuple[Any, ...]]:
    """eager, the JIT compile and the loaded package of zoo model `name`; its inputs."""
    model = zoo.build(name)
    args = zoo.inputs(name, 1)
    seq = torch.export.Dim("seq", min=2, max=60)
    program = torch.export.export(model, args, dynamic_shapes=(({1: seq},),), strict=False)
    path = os.path.join(folder, f"{name}.pt2")
    torch._inductor.aoti_compile_and_package(program, package_path=path)
    fns = {
        "eager": model,
        "jit": torch.compile(model, backend="inductor", dynamic=True),
        "package": torch._inductor.aoti_load_package(path),
    }
    for fn in fns.values():  # warm, and the same answers
        torch.testing.assert_close(fn(*args), model(*args), rtol=1e-4, atol=1e-4)
    return fns, args


def timed(fns: dict[str, Callable[..., Any]], args: tuple[Any, ...], rounds: int) -> dict:
    """Per-call milliseconds per round, per variant (rotated order each round)."""
    out: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            start = time.perf_counter()
            for _ in range(BLOCK):
                fns[name](*args)
            out[name].append((time.perf_counter() - start) / BLOCK * 1e3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["bert", "gpt2"])
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args()
    if (why := zoo.available()) is not None:
        sys.exit(why)
    torch.set_num_threads(args.threads)
    print(f"load average at the start: {os.getloadavg()}; {args.threads} torch thread(s)")
    with tempfile.TemporaryDirectory() as folder, torch.no_grad():
        for name in args.models:
            fns, inputs = variants(name, folder)
            ms = timed(fns, inputs, args.rounds)
            med = {k: statistics.median(v) for k, v in ms.items()}
            paired = statistics.median(p / j for p, j in zip(ms["package"], ms["jit"], strict=True))
            print(
                f"{name:8} eager {med['eager']:.3f} ms  jit {med['jit']:.3f} ms  "
                f"package {med['package']:.3f} ms  package/jit {paired:.2f} (paired)"
            )
    print(f"load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
