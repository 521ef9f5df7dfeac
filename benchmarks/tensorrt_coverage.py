"""Share of each test model's ops that the tensorrt backend would hand to TensorRT (CPU-only).

    python benchmarks/tensorrt_coverage.py [--min-block-size N] [--exclude aten.gelu ...]

Runs steps 1-3 (ATen graph, lowering, partitioning) on every graph dynamo produces for
each model in tests/models.py and prints ops total / to TensorRT / engines / fallbacks.
No TensorRT or GPU is needed: this is the plan, not a timing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends.tensorrt.partitioning import PartitionOptions
from backends.tensorrt.pipeline import plan
from tests.models import MODELS, build


def coverage(name: str, options: PartitionOptions) -> list[dict[str, Any]]:
    """The partition facts of every dynamo graph of model `name`."""
    model, args = build(name)
    facts: list[dict[str, Any]] = []

    def planner(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        facts.append(plan(gm, example_inputs, options).result.details("tensorrt"))
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=planner)(*args)
    return facts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-block-size", type=int, default=5)
    parser.add_argument("--exclude", nargs="*", default=[], help="torch_executed_ops")
    args = parser.parse_args()
    options = PartitionOptions(args.min_block_size, frozenset(args.exclude))
    print(
        f"{'model':<12} {'graph':>5} {'ops':>4} {'to TRT':>7} {'share':>6} {'engines':>7}  fallback"
    )
    for name in MODELS:
        for i, f in enumerate(coverage(name, options)):
            share = f["ops_tensorrt"] / f["ops_total"] if f["ops_total"] else 0.0
            fallback = "; ".join(f"{op} ({', '.join(r)})" for op, r in f["fallback"].items())
            print(
                f"{name:<12} {i:>5} {f['ops_total']:>4} {f['ops_tensorrt']:>7} {share:>6.0%} "
                f"{f['engines']:>7}  {fallback or '-'}"
            )


if __name__ == "__main__":
    main()
