"""What the user's weight updates cost: one refresh per backend, and noticing them per call.

    python benchmarks/weights_refresh.py [--repeats 5] [--calls 20000]

On a small BertModel (hidden 32, 2 layers, 2x8 tokens, random weights: the test suite's)
and a 3-layer MLP (whose every weight ONNX Runtime keeps as a named initializer):

- ONNX Runtime, one refresh: a new session with the current weights as initializers
  (`backends.onnxruntime.refresh`; only where every changed weight kept its initializer:
  on the BERT, embeddings and LayerNorms only) against a re-export (export + session);
- noticing an update: the per-call check (`Weights.same`: identities and version counters
  of the graph's weights, before each call), alone, per call; and the handling of an update
  by a winner that reads the weights live (the baseline taken anew: fingerprints);
- eager, inductor and AOTInductor packages read the weights they are handed (packages
  keep no weight: `prepare_graph(..., frozen=())`): nothing to refresh, 0 by construction.

Medians over `--repeats` (refreshes) and per-call means over `--calls` calls. Timings on
a shared machine are noisy: report `uptime` with them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backends.common.fx_utils import weight_inputs
from backends.registry import lookup_backend
from chain.run.watch.weights import Weights
from chain.select.isolation import RUN_TIME_PARTS


def _bert() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=64,
                        max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    return BertModel(config).eval(), (torch.randint(0, 100, (2, 8)),)


def _mlp() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                          nn.Linear(256, 16))  # fmt: skip
    return model.eval(), (torch.randn(8, 64),)


def _captured(model: nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[Any, list[Any], Any]:
    """(the ORT runner, the graph's inputs, the graph module) of the model's first graph."""
    seen: list[tuple[Any, list[Any], fx.GraphModule]] = []

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        runner = lookup_backend("onnxruntime")(gm, example_inputs)
        seen.append((runner, list(example_inputs), gm))
        return runner

    with torch.no_grad():
        torch.compile(model, backend=backend, dynamic=False)(*args)
    return seen[0]


def _median_s(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def refreshes(name: str, repeats: int) -> None:
    model, args = _bert() if name == "bert" else _mlp()
    runner, inputs, gm = _captured(model, args)
    frozen = runner.graph.frozen
    mapped = runner.refresher.mapped
    rebuild_s = _median_s(lambda: runner._rebuild(inputs), repeats)
    line = f"{name}: {len(frozen)} frozen weights, {len(mapped)} kept by name; "
    line += f"re-export {rebuild_s * 1e3:.1f} ms"
    if mapped:
        update_s = _median_s(lambda: runner._update(inputs, runner.refresher), repeats)
        line += f", initializer update {update_s * 1e3:.1f} ms ({rebuild_s / update_s:.0f}x)"
    print(line)
    positions = list(weight_inputs(gm, inputs))
    names = [str(i) for i in positions]
    weights = Weights(positions, names, inputs, RUN_TIME_PARTS)
    rebase_s = _median_s(lambda: weights.rebase(inputs), repeats)
    print(f"{name}: an update to a live-weights winner (baseline taken anew): "
          f"{rebase_s * 1e3:.2f} ms")  # fmt: skip


def per_call(name: str, calls: int) -> None:
    model, args = _bert() if name == "bert" else _mlp()
    _, inputs, gm = _captured(model, args)
    positions = list(weight_inputs(gm, inputs))
    weights = Weights(positions, [str(i) for i in positions], inputs, RUN_TIME_PARTS)
    same = weights.same
    start = time.perf_counter()
    for _ in range(calls):
        same(inputs)
    took = (time.perf_counter() - start) / calls
    with torch.no_grad():
        start = time.perf_counter()
        for _ in range(200):
            gm(*inputs)
        call = (time.perf_counter() - start) / 200
    print(f"{name}: noticing updates costs {took * 1e6:.2f} us a call ({len(positions)} weights),"
          f" {took / call:.2%} of the graph's eager call ({call * 1e3:.3f} ms)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20000)
    options = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    for name in ("mlp", "bert"):
        refreshes(name, options.repeats)
        per_call(name, options.calls)


if __name__ == "__main__":
    main()
