"""Exported programs vs the chain that built them: latency of eager, torch.compile(chain), and
the saved-then-loaded ExportedProgram (run_payload op), per test model, and export time.

    python benchmarks/export_overhead.py [--models cnn transformer] [--calls 200] [--rounds 9]

Columns are timed interleaved round by round; each cell is the median of per-round means.
"""

from __future__ import annotations

import argparse
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

import chain
from tests.models import build


def per_call_ms(fn: Callable[..., Any], args: tuple[Any, ...], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - start) / calls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["cnn", "transformer"])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=9)
    opts = parser.parse_args()
    print(f"{'model':12} {'export s':>9} {'eager ms':>9} {'compiled ms':>12} {'loaded ms':>10}")
    for name in opts.models:
        model, args = build(name)
        start = time.perf_counter()
        result = chain.export(model, args, backend=chain.chain("onnxruntime", "eager"))
        export_s = time.perf_counter() - start
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "program.pt2"
            torch.export.save(result.program, path)
            loaded = torch.export.load(path).module()
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=chain.chain("onnxruntime", "eager"))
        fns = {"eager": model, "compiled": compiled, "loaded": loaded}
        times: dict[str, list[float]] = {k: [] for k in fns}
        with torch.no_grad():
            for fn in fns.values():
                per_call_ms(fn, args, 10)  # warm-up: sessions, dynamo compile
            for _ in range(opts.rounds):
                for key, fn in fns.items():
                    times[key].append(per_call_ms(fn, args, opts.calls))
        med = {k: statistics.median(v) for k, v in times.items()}
        print(
            f"{name:12} {export_s:9.2f} {med['eager']:9.3f} {med['compiled']:12.3f} "
            f"{med['loaded']:10.3f}"
        )


if __name__ == "__main__":
    main()
