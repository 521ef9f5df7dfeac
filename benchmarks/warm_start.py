"""Cold vs warm first call, each in a fresh process: what remembered decisions save.

    python benchmarks/warm_start.py [--models distilbert convnext] [--repeats 1]

Per model and backend, three fresh processes share one cache directory (CHAIN_CACHE_DIR
and TORCHINDUCTOR_CACHE_DIR, empty at the start): `cold` selects and stores the decisions,
`warm` finds them (it compiles and verifies each winner only). The time is the first call:
compile and one run, from `torch.compile(...)` to its result. Backends: dynamo's `eager`
(the floor a warm start is held to), `inductor` alone (the floor when inductor is the
remembered winner), the default chain, and `fastest` with inductor.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BACKENDS = {
    "compile(eager)": "'eager'",
    # inductor alone, its own caches warm: the floor of a warm start whose winner is inductor
    # (its per-process start-up: the CPU instruction-set probe, loading its FX graph cache)
    "compile(inductor)": "'inductor'",
    "default chain": "chain(*default_backends())",
    "fastest+inductor": "chain('onnxruntime', 'inductor', 'eager', mode='fastest')",
}

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
print(json.dumps({"first_s": first_s, "remembered": remembered, "winners": winners}))
"""


def first_call(model: str, backend: str, cache: Path) -> dict[str, object]:
    """One fresh process: the first call's seconds, graphs remembered, winners."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CHAIN_MEMORY": "1",
        "CHAIN_CACHE_DIR": str(cache),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
    }
    env.pop("CHAIN_STORE", None)
    code = textwrap.dedent(_CHILD).replace("BACKEND", backend)
    done = subprocess.run(
        [sys.executable, "-c", code, model], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{model} / {backend}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["distilbert", "convnext"])
    parser.add_argument("--repeats", type=int, default=1, help="warm processes per cell")
    args = parser.parse_args()
    print("| model | backend | cold first call s | warm first call s | remembered | winners |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for model in args.models:
        for label, backend in BACKENDS.items():
            with tempfile.TemporaryDirectory(prefix="warm-start-") as tmp:
                try:
                    cold_s = f"{first_call(model, backend, Path(tmp))['first_s']:.2f}"
                except RuntimeError as e:  # a failed cold start is a cell, not the end
                    cold_s = f"failed: {str(e).strip().splitlines()[-1][:80]}"
                warm = [first_call(model, backend, Path(tmp)) for _ in range(args.repeats)]
            best = min(w["first_s"] for w in warm)  # type: ignore[type-var]
            print(
                f"| {model} | {label} | {cold_s} | {best:.2f} | "
                f"{warm[0]['remembered']} | {', '.join(map(str, warm[0]['winners']))} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
