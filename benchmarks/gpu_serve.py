"""Serve real transformers models on CUDA through the default chain, beside inductor's
reduce-overhead: the run-time race's challengers (inductor and its CUDA graphs variant) on a GPU.

Per model: each contender's first call; the chain serves `--calls` calls (its race runs on
sampled ones), then its report says who serves each graph and what the race did; then the
contenders are timed side by side (rounds of `--block` calls each, the order rotating) and
the medians and ratios printed; last, an in-place weight update (every parameter scaled)
and each contender's answer against eager's on the new weights.

    python benchmarks/gpu_serve.py [--models bert_base gpt2] [--calls 3000]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from chain import DEFAULT_CHAIN, chain


def build(name: str, device: str, layers: int, hidden: int) -> tuple[torch.nn.Module, torch.Tensor]:
    """A model from its config (random weights) on `device` and its input ids."""
    torch.manual_seed(0)
    if name == "bert_base":
        from transformers import BertConfig, BertModel

        model = BertModel(
            BertConfig(
                num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=hidden // 64
            )
        )
        ids = torch.randint(0, 30522, (8, 128))
    else:
        from transformers import GPT2Config, GPT2LMHeadModel

        model = GPT2LMHeadModel(GPT2Config(n_layer=layers, n_embd=hidden, n_head=hidden // 64))
        ids = torch.randint(0, 50257, (1, 64))
    return model.eval().to(device), ids.to(device)


def first(out: Any) -> torch.Tensor:
    """The tensor to compare: last_hidden_state or logits."""
    return out[0] if not isinstance(out, torch.Tensor) else out


def sync(ids: torch.Tensor) -> None:
    if ids.is_cuda:
        torch.cuda.synchronize()


def per_call_ms(fn: Callable[..., Any], ids: torch.Tensor, calls: int) -> float:
    sync(ids)
    start = time.perf_counter()
    for _ in range(calls):
        fn(ids)
    sync(ids)
    return (time.perf_counter() - start) / calls * 1e3


def serve(name: str, args: argparse.Namespace) -> None:
    calls, rounds, block = args.calls, args.rounds, args.block
    model, ids = build(name, args.device, args.layers, args.hidden)
    backend = chain(*DEFAULT_CHAIN)  # mode "first", challengers "auto"
    kw: dict[str, Any] = {"use_cache": False} if name == "gpt2" else {}
    models = {k: copy.deepcopy(model) for k in ("eager", "reduce-overhead", "chain")}
    fns: dict[str, Callable[..., Any]] = {
        "eager": lambda x: models["eager"](x, **kw),
        "reduce-overhead": torch.compile(lambda x: models["reduce-overhead"](x, **kw),
                                         mode="reduce-overhead", dynamic=False),
        "chain": torch.compile(lambda x: models["chain"](x, **kw), backend=backend, dynamic=False),
    }  # fmt: skip
    with torch.inference_mode():
        want = first(fns["eager"](ids)).float()
        for key, fn in fns.items():
            took = per_call_ms(fn, ids, 1)
            err = (first(fn(ids)).float() - want).abs().max().item()
            print(f"{name} {key}: first call {took / 1e3:.1f} s, max abs err {err:.1e}")
        start = time.perf_counter()
        served = per_call_ms(fns["chain"], ids, calls)
        print(f"{name} chain: {calls} calls served in {time.perf_counter() - start:.1f} s "
              f"({served:.3f} ms/call with the race)")  # fmt: skip
        print(backend.report)
        times: dict[str, list[float]] = {k: [] for k in fns}
        keys = list(fns)
        for r in range(rounds):
            for key in keys[r % 3 :] + keys[: r % 3]:
                times[key].append(per_call_ms(fns[key], ids, block))
        med = {k: statistics.median(v) for k, v in times.items()}
        for key in keys:
            print(f"{name} {key}: median {med[key]:.3f} ms/call "
                  f"(rounds {min(times[key]):.3f}-{max(times[key]):.3f}), "
                  f"{med['eager'] / med[key]:.2f}x eager, "
                  f"{med['reduce-overhead'] / med[key]:.2f}x reduce-overhead")  # fmt: skip
        for m in models.values():  # a weight update in place, as an optimizer step would
            for p in m.parameters():
                p.mul_(0.9)
        want = first(fns["eager"](ids)).float()
        for key in ("reduce-overhead", "chain"):
            err = (first(fns[key](ids)).float() - want).abs().max().item()
            print(f"{name} {key} after the weight update: max abs err {err:.1e} against eager")
        print(backend.report.graphs[0].notes[-6:] if backend.report.graphs else "no graph")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["bert_base", "gpt2"])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--block", type=int, default=20)
    parser.add_argument("--layers", type=int, default=12, help="12: bert-base's and GPT-2's")
    parser.add_argument("--hidden", type=int, default=768, help="heads: hidden / 64")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run of this script")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_serve: no CUDA device here")
    print(torch.__version__, torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu")
    for name in args.models:
        serve(name, args)


if __name__ == "__main__":
    main()
