"""Real models at changing shapes: does every call run, match eager, and who runs it?

    python benchmarks/real_model_safety.py [--models bert,gpt2] [--dynamic default,true]
        [--grad inference_mode,no_grad] [--out safety.md]

For each small transformers model of `chain.bench.zoo` (BertModel, GPT2Model, T5 encoder,
ViTModel, LlamaModel, and with `--models architectures` GPT-NeoX, Falcon, Phi, Gemma, a
Whisper encoder, ViT, CLIP text, wav2vec2, T5, BLOOM; random weights from configs), each
chain (the default chain, `chain("onnxruntime", "eager")`, and `chain("inductor",
"onnxruntime", "eager", mode="fastest")`), each `dynamic` (torch.compile's default, True)
and each grad mode (`torch.inference_mode()`, `torch.no_grad()`), the model is compiled once
and called at three shapes. Per call: whether it ran, whether its output matches eager's
(max abs error under 1e-4), the winners of the graphs compiled at that call (`-`: no new
graph, dynamo reused a dynamic one) and the seconds the chain spent compiling them. Per
run: which backend serves the main graph (the one with most nodes) after the three calls.
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
from chain.select.core import Chain

CHAINS = {
    "default": lambda: chain(*default_backends()),
    "ort": lambda: chain("onnxruntime", "eager"),
    "fastest+inductor": lambda: chain("inductor", "onnxruntime", "eager", mode="fastest"),
}
TOLERANCE = 1e-4
DYNAMIC = {"default": None, "true": True}
GRAD = {"inference_mode": torch.inference_mode, "no_grad": torch.no_grad}


@dataclass(frozen=True)
class Call:
    """One call of a compiled model at one shape."""

    model: str
    chain: str
    dynamic: str
    grad: str
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


@dataclass(frozen=True)
class Served:
    """Who serves the main graph of one compiled model after its three calls."""

    model: str
    chain: str
    dynamic: str
    grad: str
    main: str
    graphs: str


def calls_of(name: str, label: str, dynamic: str, grad: str) -> tuple[list[Call], Served]:
    """The model compiled through the chain `label`, called at its three shapes."""
    model, backend = zoo.build(name), CHAINS[label]()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, dynamic=DYNAMIC[dynamic])
    out = []
    for shape in range(3):
        args = zoo.inputs(name, shape)
        before = len(backend.report.graphs)
        start = time.perf_counter()
        with GRAD[grad]():
            try:
                got, error = compiled(*args), ""
            except Exception as exc:  # recorded in the table: the point of this benchmark
                got, error = None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
            want = model(*args)
        wall = time.perf_counter() - start
        err = float((got - want).abs().max()) if got is not None else None
        run = (name, label, dynamic, grad)
        out.append(_call(run, shape, backend, before, got is not None, err, wall, error))
    graphs = backend.report.graphs
    main = max(graphs, key=lambda g: g.num_nodes, default=None)
    served = Served(
        name, label, dynamic, grad,
        str(main.winner) if main is not None else "-",
        ", ".join(str(g.winner) for g in graphs) or "-",
    )  # fmt: skip
    return out, served


def _call(
    run: tuple[str, str, str, str],
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
    name = run[0]
    return Call(*run, zoo.describe(name, shape), ran, err, winners, compile_s, wall, error)


def table(calls: list[Call]) -> str:
    lines = [
        "| model | chain | dynamic | grad | shape | runs | matches (max err) "
        "| winners of new graphs | compile s | call s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | ---: | ---: |",
    ]
    for c in calls:
        err = f"{c.max_err:.1e}" if c.max_err is not None else c.error
        lines.append(
            f"| {c.model} | {c.chain} | {c.dynamic} | {c.grad} | {c.shape} "
            f"| {'yes' if c.ran else 'NO'} "
            f"| {'yes' if c.matches else 'NO'} ({err}) | {c.winners} | {c.compile_s:.1f} "
            f"| {c.wall_s:.1f} |"
        )
    ran = sum(c.ran for c in calls)
    matched = sum(c.matches for c in calls)
    lines.append(f"\n{ran}/{len(calls)} calls ran, {matched}/{len(calls)} matched eager.")
    return "\n".join(lines)


def served_table(served: list[Served]) -> str:
    """Per model and setting: the main graph's server, and every graph's."""
    lines = [
        "| model | chain | dynamic | grad | main graph served by | all graphs |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {s.model} | {s.chain} | {s.dynamic} | {s.grad} | {s.main} | {s.graphs} |"
        for s in served
    ]
    compiled = {s.model for s in served if s.main not in ("eager", "-")}
    every = {s.model for s in served}
    always = {m for m in every if all(s.main not in ("eager", "-") for s in served if s.model == m)}
    lines.append(
        f"\nA compiled backend serves the main graph of {len(always)}/{len(every)} models in "
        f"every setting ({len(compiled)}/{len(every)} in at least one)."
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", default=",".join(zoo.MODELS), help="names, or `architectures` for the set"
    )
    parser.add_argument("--chains", default=",".join(CHAINS))
    parser.add_argument("--dynamic", default="default,true", help="default and/or true")
    parser.add_argument("--grad", default="inference_mode,no_grad")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = parser.parse_args()
    if (reason := zoo.available()) is not None:
        sys.exit(reason)
    models = list(zoo.ARCHITECTURES) if args.models == "architectures" else args.models.split(",")
    labels, dynamics, grads = args.chains.split(","), args.dynamic.split(","), args.grad.split(",")
    every = (*zoo.MODELS, *zoo.ARCHITECTURES)
    unknown = [m for m in models if m not in every] + [c for c in labels if c not in CHAINS]
    unknown += [d for d in dynamics if d not in DYNAMIC] + [g for g in grads if g not in GRAD]
    if unknown:
        sys.exit(
            f"unknown: {', '.join(unknown)}; models: {every}; chains: {list(CHAINS)}; "
            f"dynamic: {list(DYNAMIC)}; grad: {list(GRAD)}"
        )
    if args.threads:
        torch.set_num_threads(args.threads)
    calls: list[Call] = []
    served: list[Served] = []
    for name in models:
        for label in labels:
            for dynamic in dynamics:
                for grad in grads:
                    print(
                        f"{name} through {label}, dynamic={dynamic}, {grad} ...",
                        file=sys.stderr,
                        flush=True,
                    )
                    got, who = calls_of(name, label, dynamic, grad)
                    calls += got
                    served.append(who)
    text = served_table(served) + "\n\n" + table(calls)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
