"""Launch-bound model at batch 1: median latency of eager vs the cudagraphs backend.

Many tiny ops (a Linear, tanh, scale and residual add per layer) leave the GPU waiting on
kernel launches; replaying one CUDA graph removes that overhead. The two are timed
interleaved in one process (alternating which goes first), each call CUDA-synchronized,
and reported as medians and their ratio.

    python benchmarks/launch_bound.py [--depth 32] [--dim 64] [--repeats 300]

Without a CUDA device it prints why and exits with status 1: there is nothing to measure.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a plain script

from backends.cudagraphs import cudagraphs, cudagraphs_available
from tests.models import LaunchBound


def timed_call(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> float:
    """Seconds for one call, with the GPU drained before and after."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn(x)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def interleaved_medians(
    fns: dict[str, Callable[[torch.Tensor], torch.Tensor]], x: torch.Tensor, repeats: int
) -> dict[str, float]:
    """Median milliseconds per function, calls interleaved and their order alternated."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for i in range(repeats):
        for name in names if i % 2 == 0 else reversed(names):
            times[name].append(timed_call(fns[name], x))
    return {name: 1e3 * statistics.median(samples) for name, samples in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=32, help="layers (4 small ops each)")
    parser.add_argument("--dim", type=int, default=64, help="width of each layer")
    parser.add_argument("--repeats", type=int, default=300, help="timed calls per variant")
    parser.add_argument("--warmup", type=int, default=20, help="untimed calls per variant")
    args = parser.parse_args(argv)

    if reason := cudagraphs_available():
        print(f"launch_bound: nothing to measure: {reason} (needs a CUDA device)", file=sys.stderr)
        return 1

    torch.manual_seed(0)
    model = LaunchBound(args.depth, args.dim).eval().cuda()
    x = torch.randn(1, args.dim, device="cuda")
    with torch.no_grad():
        fns = {"eager": model, "cudagraphs": torch.compile(model, backend=cudagraphs)}
        for fn in fns.values():
            for _ in range(args.warmup):
                fn(x)
        max_err = (fns["cudagraphs"](x) - model(x)).abs().max().item()
        medians = interleaved_medians(fns, x, args.repeats)

    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"model: LaunchBound(depth={args.depth}, dim={args.dim}), batch 1, {args.repeats} runs")
    for name, ms in medians.items():
        print(f"  {name:<11} median {ms:8.4f} ms")
    print(f"  speedup (eager / cudagraphs): {medians['eager'] / medians['cudagraphs']:.2f}x")
    print(f"  max |cudagraphs - eager|: {max_err:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
