"""Cold vs warm first call, each in a fresh process: what remembered decisions save.

    python benchmarks/warm_start.py [--models distilbert convnext] [--repeats 1]

Per model and backend, fresh processes share one cache directory (CHAIN_CACHE_DIR and
TORCHINDUCTOR_CACHE_DIR, empty at the start): `cold` selects and stores the decisions (and,
for an inductor winner, builds its AOTInductor package in the background: the process ends
when it is stored), `warm` finds them (it compiles and verifies each winner only, or loads
its package). The time is the first call: compile and one run, from `torch.compile(...)` to
its result. Backends: dynamo's `eager` (the floor a warm start is held to), `inductor` alone
(its own caches warm: what a warm start cost before packages), the default chain, and
`fastest` with inductor (with and without ONNX Runtime, and without the eager floor, whose
decision is kept however busy the machine). `x eager` is the warm first call
over compile(eager)'s; `cold/warm` the cold first call over the warm one; `packages` the
graphs a warm process ran from a package, and whether it imported inductor's compiler.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import textwrap
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.load import fresh_python

BACKENDS = {
    "compile(eager)": "'eager'",
    # inductor alone, its own caches warm: the floor of a warm start whose winner is inductor
    # (its per-process start-up: the CPU instruction-set probe, loading its FX graph cache)
    "compile(inductor)": "'inductor'",
    "default chain": "chain(*default_backends())",
    "fastest+inductor": "chain('onnxruntime', 'inductor', 'eager', mode='fastest')",
    "fastest(inductor)": "chain('inductor', 'eager', mode='fastest')",
    # the same without the eager floor: remembered even when this machine is too busy for
    # a decision the floor would keep (the warm start of a remembered inductor winner)
    "fastest(inductor), no floor": "chain('inductor', 'eager', mode='fastest', eager_floor=False)",
    # the same with no package (CUDA, a failed build, CHAIN_INDUCTOR_PACKAGE=0): inductor's
    # FX graph cache, under the remembered vector-ISA verdict (backends.inductor.isa)
    "fastest(inductor), no floor, no package": (
        "chain('inductor', 'eager', mode='fastest', eager_floor=False)"
    ),
}
ENV = {"fastest(inductor), no floor, no package": {"CHAIN_INDUCTOR_PACKAGE": "0"}}

_CHILD = """
import json, sys, time
import torch
from chain import chain, default_backends

def distilbert():
    from transformers import DistilBertConfig, DistilBertModel
    config = DistilBertConfig(vocab_size=1000, dim=128, n_layers=4, n_heads=4,
                              hidden_dim=256, max_position_embeddings=128)
    return DistilBertModel(config).eval(), (torch.randint(0, 1000, (4, 64)),)

def convnext():
    from transformers import ConvNextConfig, ConvNextModel
    config = ConvNextConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 2, 1],
                            image_size=64)
    return ConvNextModel(config).eval(), (torch.randn(2, 3, 64, 64),)

torch.manual_seed(0)
model, inputs = {"distilbert": distilbert, "convnext": convnext}[sys.argv[1]]()
backend = BACKEND
start = time.perf_counter()
with torch.no_grad():
    torch.compile(model, backend=backend)(*inputs)
first_s = time.perf_counter() - start
records = backend.report.graphs if hasattr(backend, "report") else []
remembered = sum(any(n.startswith("remembered:") for n in g.notes) for g in records)
winners = [g.winner for g in records]
packages = sum(
    any(a.details.get("from_package") for a in g.attempts if a.backend == g.winner)
    for g in records
)
compiler = "torch._inductor.compile_fx" in sys.modules
print(json.dumps({"first_s": first_s, "remembered": remembered, "winners": winners,
                  "packages": packages, "inductor_imported": compiler}))
"""


def first_call(
    model: str, backend: str, cache: Path, extra: dict[str, str] | None = None
) -> dict[str, object]:
    """One fresh process (`extra` added to its environment): the first call's seconds,
    graphs remembered, winners."""
    env: dict[str, str | None] = {
        **(extra or {}),
        "CHAIN_MEMORY": "1",
        "CHAIN_CACHE_DIR": str(cache),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "CHAIN_STORE": None,
    }
    code = textwrap.dedent(_CHILD).replace("BACKEND", backend)
    try:
        return fresh_python(code, [model], env)
    except RuntimeError as e:
        raise RuntimeError(f"{model} / {backend}: {e}") from e


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["distilbert", "convnext"])
    parser.add_argument("--repeats", type=int, default=1, help="warm processes per cell")
    parser.add_argument("--backends", nargs="+", choices=list(BACKENDS), default=list(BACKENDS))
    args = parser.parse_args()
    print(f"load average at the start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    print(
        "| model | backend | cold first call s | warm first call s | x eager | cold/warm "
        "| remembered | packages | winners |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for model in args.models:
        eager_s: float | None = None
        for label in args.backends:
            backend = BACKENDS[label]
            with tempfile.TemporaryDirectory(prefix="warm-start-") as tmp:
                cold: float | None = None
                try:
                    first = first_call(model, backend, Path(tmp), ENV.get(label))
                    cold = float(first["first_s"])  # type: ignore[arg-type]
                    cold_s = f"{cold:.2f}"
                except RuntimeError as e:  # a failed cold start is a cell, not the end
                    cold_s = f"failed: {str(e).strip().splitlines()[-1][:80]}"
                warm = [
                    first_call(model, backend, Path(tmp), ENV.get(label))
                    for _ in range(args.repeats)
                ]
            best = min(float(w["first_s"]) for w in warm)  # type: ignore[arg-type]
            if label == "compile(eager)":
                eager_s = best
            ratio = f"{best / eager_s:.2f}" if eager_s else "n/a"
            speedup = f"{cold / best:.1f}" if cold else "n/a"
            imported = " (inductor imported)" if warm[0].get("inductor_imported") else ""
            print(
                f"| {model} | {label} | {cold_s} | {best:.2f} | {ratio} | {speedup} | "
                f"{warm[0]['remembered']} | {warm[0].get('packages', 0)}{imported} | "
                f"{', '.join(map(str, warm[0]['winners']))} |",
                flush=True,
            )
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
