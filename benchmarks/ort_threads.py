"""ONNX Runtime's intra-op threads on CPU: measured per graph (the backend's default, see
backends/onnxruntime/threads.py) against ORT's own default and one thread, both pinned.

    python benchmarks/ort_threads.py [--threads 2] [--models small bert_h128 bert_h256]

Per model, three chains of `onnxruntime` alone (`measure=False`: it serves whatever its
timing says): the thread count left to the backend (measured), pinned to
`os.cpu_count()` (ORT's default on a machine whose cores are physical), and pinned to 1.
They are timed side by side with eager in one interleaved run (chain.judge.rounds.measure).
The table gives medians and, for the measured chain, the count it chose and why.

`small` is the busy benchmark's four sub-millisecond transformers (benchmarks/busy_cell:
2 layers, hidden 64, 2x16 tokens); `bert_h128` a 2-layer BERT at hidden 128 over 4x64
tokens (about 3 ms); `bert_h256` 4 layers at hidden 256 over 2x128 (about 13 ms). Random
weights, nothing downloaded.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.busy_cell import MODELS, build
from chain import chain
from chain.judge.rounds import measure


def bert(hidden: int, layers: int, batch: int, seq: int) -> tuple[Any, tuple[Any, ...]]:
    """A BertModel from a config (random weights) returning its last hidden state."""
    import transformers as tf

    from chain.bench.real_models import LastHidden

    torch.manual_seed(0)
    config = tf.BertConfig(vocab_size=1000, hidden_size=hidden, num_hidden_layers=layers,
                           num_attention_heads=4, intermediate_size=4 * hidden)  # fmt: skip
    return LastHidden(tf.BertModel(config)).eval(), (torch.randint(0, 1000, (batch, seq)),)


def cases(names: list[str]) -> dict[str, tuple[Any, tuple[Any, ...]]]:
    """name -> (model, inputs) for the groups asked for."""
    out: dict[str, tuple[Any, tuple[Any, ...]]] = {}
    for name in names:
        if name == "small":
            for model in MODELS:
                module, inputs = build(model, quick=False)
                out[model] = (module, inputs[0])
        elif name == "bert_h128":
            out[name] = bert(128, 2, 4, 64)
        elif name == "bert_h256":
            out[name] = bert(256, 4, 2, 128)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--models", nargs="+", default=["small", "bert_h128", "bert_h256"],
                        choices=["small", "bert_h128", "bert_h256"])  # fmt: skip
    parser.add_argument("--budget-s", type=float, default=3.0, help="timing budget per model")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch._dynamo.config.recompile_limit = 64  # three chains per model class
    cores = os.cpu_count() or 1
    print(f"load average at the start: {os.getloadavg()}; {args.threads} torch thread(s)")
    print(f"| model | eager ms | measured ms | pinned {cores} ms | pinned 1 ms | chosen |")
    print("|---|--:|--:|--:|--:|---|")
    for name, (model, inputs) in cases(args.models).items():
        torch._dynamo.reset()
        fns: dict[str, Any] = {"eager": model}
        chains = {}
        for label, count in (("measured", None), ("cores", cores), ("one", 1)):
            options = {"onnxruntime": {"intra_op_num_threads": count}} if count else {}
            chains[label] = chain("onnxruntime", measure=False, options=options)
            fns[label] = torch.compile(model, backend=chains[label])
            with torch.no_grad():
                fns[label](*inputs)
        ms = {k: t.median_ms for k, t in measure(fns, inputs, baseline="eager",
                                                  budget_s=args.budget_s).items()}  # fmt: skip
        chosen = "; ".join(
            f"{g.winning_attempt.details.get('intra_op_threads')}: "
            f"{g.winning_attempt.details.get('intra_op_threads_why')}"
            for g in chains["measured"].report.graphs
            if g.winning_attempt is not None
        )
        print(f"| {name} | {ms['eager']:.3f} | {ms['measured']:.3f} | {ms['cores']:.3f} | "
              f"{ms['one']:.3f} | {chosen} |", flush=True)  # fmt: skip
    print(f"load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
