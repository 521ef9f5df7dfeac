"""Loaded programs by exported backend: a signed AOTInductor package against ONNX Runtime.

Each tiny config of `benchmarks/export_overhead.py` (DistilBERT, ViT, ConvNeXt, GPT-2) is
exported twice, with chain("inductor", "onnxruntime", "eager") under a throwaway
CHAIN_PROGRAM_KEY (inductor wins: its package is exported) and with chain("onnxruntime",
"eager"), saved and loaded with `chain.load`; then eager, the inductor program and the
ORT program are timed side by side in one process under `inference_mode`, in interleaved
rounds (shuffled order, `--calls` calls a round, the median kept). Prints median ms and
the speedup over eager. The package's compile runs in a child process at export (about
20-30 s a model on a 2-core CPU).

    python benchmarks/export_backends.py [--models distilbert vit convnext gpt2]
        [--rounds 40] [--calls 5]
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import chain
from backends.inductor.deploy import KEY_ENV
from benchmarks.export_overhead import TINY, tiny_configs


def loaded(model: torch.nn.Module, args: tuple[Any, ...], backends: tuple[str, ...]) -> Any:
    """The model exported through `backends`, saved and loaded: its module and parts."""
    result = chain.export(model, args, backend=chain.chain(*backends, measure=False))
    with tempfile.TemporaryDirectory() as folder:
        torch.export.save(result.program, Path(folder) / "program.pt2")
        program = chain.load(Path(folder) / "program.pt2")
    return program.module(), [p["backend"] for p in result.parts]


def timed(
    runs: dict[str, Callable[..., Any]], args: tuple[Any, ...], rounds: int, calls: int
) -> dict[str, float]:
    """Median ms per call of each variant over interleaved rounds (warmed up first)."""
    times: dict[str, list[float]] = {k: [] for k in runs}
    keys = list(runs)
    with torch.inference_mode():
        for fn in runs.values():
            for _ in range(10):
                fn(*args)
        for _ in range(rounds):
            random.shuffle(keys)
            for key in keys:
                samples = []
                for _ in range(calls):
                    start = time.perf_counter()
                    runs[key](*args)
                    samples.append((time.perf_counter() - start) * 1e3)
                times[key].append(statistics.median(samples))
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(TINY), choices=list(TINY))
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--calls", type=int, default=5)
    ns = parser.parse_args()
    os.environ[KEY_ENV] = secrets.token_hex(16)  # this process exports and loads
    builders = tiny_configs()
    head = ("eager ms", 10), ("inductor ms", 13), ("ort ms", 9), ("inductor x", 12), ("ort x", 8)
    print(f"{'model':12}" + "".join(f"{label:>{width}}" for label, width in head))
    for name in ns.models:
        torch.manual_seed(0)
        model, args = builders[name]()
        model.eval()
        inductor, parts_i = loaded(model, args, ("inductor", "onnxruntime", "eager"))
        ort, parts_o = loaded(model, args, ("onnxruntime", "eager"))
        if parts_i != ["inductor"] or parts_o != ["onnxruntime"]:
            raise RuntimeError(f"{name}: exported {parts_i} and {parts_o}, not one part each")
        med = timed({"eager": model, "inductor": inductor, "ort": ort}, args, ns.rounds, ns.calls)
        e = med["eager"]
        print(
            f"{name:12}{e:10.3f}{med['inductor']:13.3f}{med['ort']:9.3f}"
            f"{e / med['inductor']:12.2f}{e / med['ort']:8.2f}",
            flush=True,
        )
    print(f"median ms per call, {ns.rounds} rounds x {ns.calls} calls, inference_mode, "
          f"torch threads {torch.get_num_threads()}")  # fmt: skip


if __name__ == "__main__":
    main()
