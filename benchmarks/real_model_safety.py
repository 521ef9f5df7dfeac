"""Real models at changing shapes: does every call run, match eager, and who runs it?

    python benchmarks/real_model_safety.py [--models bert,gpt2] [--out safety.md]

For each small transformers model of `chain.bench.zoo` (BertModel, GPT2Model, T5 encoder,
ViTModel, LlamaModel; random weights from configs) and each chain (the default chain,
`chain("onnxruntime", "eager")`, and `chain("inductor", "onnxruntime", "eager",
mode="fastest")`), the model is compiled once and called at three shapes under
`torch.inference_mode()`. Per call: whether it ran, whether its output matches eager's
(max abs error under 1e-4), the winners of the graphs compiled at that call (`-`: no new
graph, dynamo reused a dynamic one) and the seconds the chain spent compiling them.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chain import chain, default_backends
from chain.bench import zoo
from chain.core import Chain

CHAINS = {
    "default": lambda: chain(*default_backends()),
    "ort": lambda: chain("onnxruntime", "eager"),
    "fastest+inductor": lambda: chain("inductor", "onnxruntime", "eager", mode="fastest"),
}
TOLERANCE = 1e-4


@dataclass(frozen=True)
class Call:
    """One call of a compiled model at one shape."""

    model: str
    chain: str
    shape: str
    ran: bool
    max_err: float | None
    winners: str
    compile_s: float
    wall_s: float
    error: str = ""

    @property
    def matches(self) -> bool:
        return self.max_err is not None and self.max_err <= TOLERANCE


def calls_of(name: str, label: str) -> list[Call]:
    """The model compiled through the chain `label`, called at its three shapes."""
    model, backend = zoo.build(name), CHAINS[label]()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    out = []
    for shape in range(3):
        args = zoo.inputs(name, shape)
        before = len(backend.report.graphs)
        start = time.perf_counter()
        with torch.inference_mode():
            try:
                got, error = compiled(*args), ""
            except Exception as exc:  # recorded in the table: the point of this benchmark
                got, error = None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
            want = model(*args)
        wall = time.perf_counter() - start
        err = float((got - want).abs().max()) if got is not None else None
        out.append(_call(name, label, shape, backend, before, got is not None, err, wall, error))
    return out


def _call(
    name: str,
    label: str,
    shape: int,
    backend: Chain,
    before: int,
    ran: bool,
    err: float | None,
    wall: float,
    error: str,
) -> Call:
    new = backend.report.graphs[before:]
    winners = ", ".join(str(g.winner) for g in new) or "-"
    compile_s = sum(a.compile_s or 0.0 for g in new for a in g.attempts)
    return Call(name, label, zoo.describe(name, shape), ran, err, winners, compile_s, wall, error)


def table(calls: list[Call]) -> str:
    lines = [
        "| model | chain | shape | runs | matches (max err) | winners of new graphs "
        "| compile s | call s |",
        "| --- | --- | --- | --- | --- | --- | ---: | ---: |",
    ]
    for c in calls:
        err = f"{c.max_err:.1e}" if c.max_err is not None else c.error
        lines.append(
            f"| {c.model} | {c.chain} | {c.shape} | {'yes' if c.ran else 'NO'} "
            f"| {'yes' if c.matches else 'NO'} ({err}) | {c.winners} | {c.compile_s:.1f} "
            f"| {c.wall_s:.1f} |"
        )
    ran = sum(c.ran for c in calls)
    matched = sum(c.matches for c in calls)
    lines.append(f"\n{ran}/{len(calls)} calls ran, {matched}/{len(calls)} matched eager.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(zoo.MODELS))
    parser.add_argument("--chains", default=",".join(CHAINS))
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = parser.parse_args()
    if (reason := zoo.available()) is not None:
        sys.exit(reason)
    models, labels = args.models.split(","), args.chains.split(",")
    unknown = [m for m in models if m not in zoo.MODELS] + [c for c in labels if c not in CHAINS]
    if unknown:
        sys.exit(f"unknown: {', '.join(unknown)}; models: {zoo.MODELS}; chains: {list(CHAINS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    calls: list[Call] = []
    for name in models:
        for label in labels:
            print(f"{name} through {label} ...", file=sys.stderr, flush=True)
            calls += calls_of(name, label)
    text = table(calls)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
