"""How far correct compilers and wrong ones sit from eager's own error against float64.

For each model, dtype and backend, one chain(backend) with verification on: the attempt's
status, its RMSE against the graph run in float64 and its ratio to eager's (the worst
output). This is the measurement behind `chain.judge.accuracy.MULTIPLE` and `FLOOR_ULPS`:
correct backends must sit well under the multiple, the fault backends of tests/faults.py
well over it.

    python benchmarks/error_ratios.py [--dtypes fp32,bf16] [--threads 1]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from chain import chain
from chain.bench.models import SUITE
from tests import faults
from tests.models import build, build_extra

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
BACKENDS = {
    "inductor": "inductor",
    "onnxruntime": "onnxruntime",
    "perturbed": faults.perturbed,
    "drops_residual": faults.drops_residual,
    "stale": faults.stale,
}


class Sum(torch.nn.Module):
    """One large reduction: the sum of a million values (the floor scales with its length)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum()


def models() -> dict[str, tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]:
    """The tests' models with dropout and residuals, a sum of 1e6 values, the suite's tiny
    models."""
    out = {name: build_extra(name) for name in ("dropout_residual", "bert")}
    torch.manual_seed(0)
    out["sum-1e6"] = (Sum(), (torch.randn(1_000_000),))
    out["transformer"] = build("transformer")
    for name in ("bert", "gpt", "vit", "resnet", "mlp"):
        out[f"suite-{name}"] = SUITE[name].build(2, "cpu", torch.float32, tiny=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print("| model | dtype | backend | status | error | eager error | ratio | reason |")
    print("|---|---|---|---|---|---|---|---|")
    for dtype_name in args.dtypes.split(","):
        dtype = DTYPES[dtype_name]
        for model_name, (model, inputs) in models().items():
            model = model.to(dtype)
            inputs = tuple(x.to(dtype) if x.is_floating_point() else x for x in inputs)
            for label, backend in BACKENDS.items():
                torch._dynamo.reset()
                c = chain(backend, "eager", measure=False)  # eager: the graph runs on
                try:
                    with torch.no_grad():
                        torch.compile(model, backend=c)(*inputs)
                except Exception as exc:  # a row with the reason, not a crash
                    print(f"| {model_name} | {dtype_name} | {label} | error: {exc!s:.60} |||")
                    continue
                for g in c.report.graphs:
                    a = g.attempts[0]
                    ratio = "-" if a.error_ratio is None else f"{a.error_ratio:.3g}"
                    err = "-" if a.error is None else f"{a.error:.2e}"
                    eager = "-" if a.eager_error is None else f"{a.eager_error:.2e}"
                    print(
                        f"| {model_name}#{g.id} | {dtype_name} | {label} | {a.status.value} "
                        f"| {err} | {eager} | {ratio} | {a.reason[:70]} |"
                    )


if __name__ == "__main__":
    main()
