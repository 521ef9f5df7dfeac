"""Per-call cost of the chain's runtime guard: a tiny graph through chain("eager") vs eager.

    python benchmarks/guard_overhead.py [--calls 20000] [--rounds 15]

Three columns, interleaved round by round, medians of the per-round means:
plain eager, torch.compile(backend="eager") (dynamo's own fixed cost per call), and
torch.compile(backend=chain("eager")) (that plus the guard).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chain import chain


def tiny(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def per_call_us(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(x)
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    x = torch.randn(8)
    candidates = {
        "eager": tiny,
        'compile(backend="eager")': torch.compile(tiny, backend="eager"),
        'compile(backend=chain("eager"))': torch.compile(tiny, backend=chain("eager")),
    }
    with torch.no_grad():
        for fn in candidates.values():
            fn(x)  # compile
        samples: dict[str, list[float]] = {name: [] for name in candidates}
        for _ in range(args.rounds):
            for name, fn in candidates.items():
                samples[name].append(per_call_us(fn, x, args.calls))
    medians = {name: statistics.median(s) for name, s in samples.items()}
    base = medians['compile(backend="eager")']
    print(f"{'':34} {'median us/call':>15} {'vs compile(eager)':>18}")
    for name, us in medians.items():
        print(f"{name:34} {us:15.2f} {us - base:+17.2f}us")


if __name__ == "__main__":
    main()
