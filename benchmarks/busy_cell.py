"""One cell of the busy-machine benchmark (benchmarks/busy.py), run in a fresh process.

`serve`: under `hogs` CPU-hog processes, the first call of compile(backend="eager") and of
the chain, then calls under the load; the hogs stop and the calls go on (`calls_quiet`
calls, and `quiet_s` seconds at least); which backend
serves each graph is read from the chain's report after every call, answers are checked
against eager on sampled calls. Then, quiet, every backend of the chain alone and the chain
as it now serves are timed in one interleaved run (chain.judge.rounds.measure).
`first`: one fresh process's first call (a warm store, or compile(backend="eager")).
The cell's arguments come as one JSON object; its result is the last line, in JSON.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
from torch import nn

from benchmarks.load import Hogs

MODELS = ("bert", "gpt2", "t5_encoder", "distilbert")
CHAINS = {  # label: (backends, options); None: the default chain (chain.default_backends)
    "first": (("onnxruntime", "inductor", "eager"), {"mode": "first"}),
    "default": (None, {}),
}
RTOL = ATOL = 1e-3  # an answer further than this from eager's is wrong (float32, small models)
POOL = 4  # input sets of the same shape, cycled: the answers checked differ from call to call


def build(name: str, quick: bool, seed: int = 0) -> tuple[nn.Module, list[tuple[Any, ...]]]:
    """A transformers model from a config (random weights, 2 layers, hidden 64 over 2x16
    tokens; hidden 32 over 2x8 when `quick`) and `POOL` input sets of one shape."""
    import transformers as tf

    from chain.bench.real_models import LastHidden

    torch.manual_seed(seed)
    hidden, seq, vocab = (32, 8, 100) if quick else (64, 16, 1000)
    heads, ffn = 4, 2 * hidden
    configs: dict[str, Callable[[], nn.Module]] = {
        "bert": lambda: tf.BertModel(tf.BertConfig(
            vocab_size=vocab, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=heads,
            intermediate_size=ffn, max_position_embeddings=64)),
        "gpt2": lambda: tf.GPT2Model(tf.GPT2Config(
            vocab_size=vocab, n_embd=hidden, n_layer=2, n_head=heads, n_positions=64,
            use_cache=False)),
        "t5_encoder": lambda: tf.T5EncoderModel(tf.T5Config(
            vocab_size=vocab, d_model=hidden, d_kv=hidden // heads, d_ff=ffn, num_layers=2,
            num_heads=heads, use_cache=False)),
        "distilbert": lambda: tf.DistilBertModel(tf.DistilBertConfig(
            vocab_size=vocab, dim=hidden, n_layers=2, n_heads=heads, hidden_dim=ffn,
            max_position_embeddings=64)),
    }  # fmt: skip
    if name not in configs:
        raise ValueError(f"unknown model {name!r}: one of {', '.join(MODELS)}")
    model = LastHidden(configs[name]()).eval()
    pool = [(torch.randint(0, vocab, (2, seq)),) for _ in range(POOL)]
    return model, pool


def make_chain(label: str) -> Any:
    """The chain a label names (CHAINS), memory as the environment says (CHAIN_MEMORY)."""
    from chain import chain, default_backends

    names, options = CHAINS[label]
    return chain(*(names or default_backends()), **options)


def alone(label: str) -> list[str]:
    """The backends of a chain, each to be timed alone in the quiet re-time (eager too)."""
    from chain import default_backends

    names = CHAINS[label][0] or default_backends()
    return list(dict.fromkeys([*names, "eager"]))


def servers(backend: Any) -> list[str]:
    """Who serves each graph now: the base name of each graph record's winner."""
    from chain.run.graphs import base_name

    return [base_name(g.winner) if g.winner else "none" for g in backend.report.graphs]


def _timed_first(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _wrong(out: torch.Tensor, ref: torch.Tensor) -> tuple[bool, float]:
    """Whether an answer is wrong against eager's, and its largest absolute error."""
    err = (out.float() - ref.float()).abs().max().item() if out.shape == ref.shape else 1e30
    return not torch.allclose(out, ref, rtol=RTOL, atol=ATOL), float(err)


def serve(spec: dict[str, Any]) -> dict[str, Any]:
    """The serving experiment of one model, chain and load (see the module's docstring)."""
    torch._dynamo.config.cache_size_limit = 64  # one entry per backend timed alone
    model, pool = build(spec["model"], spec["quick"])
    loaded, quiet, every = spec["calls_loaded"], spec["calls_quiet"], spec["sample_every"]
    quiet_s = spec.get("quiet_s", 0.0)
    out: dict[str, Any] = {"servers": [], "wrong": [], "max_error": 0.0, "checked": 0}
    with torch.no_grad(), Hogs(spec["hogs"]) as load:
        time.sleep(spec["settle_s"])  # the load is on before anything is compiled
        torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2))  # dynamo's own start-up
        torch._dynamo.reset()
        eager = torch.compile(model, backend="eager")
        out["eager_first_s"], _ = _timed_first(lambda: eager(*pool[0]))
        torch._dynamo.reset()
        backend = make_chain(spec["chain"])
        compiled = torch.compile(model, backend=backend)
        out["chain_first_s"], _ = _timed_first(lambda: compiled(*pool[0]))
        out["hogs_running"] = load.running
        last: list[str] = []
        seconds: list[float] = []
        stopped: float | None = None  # when the load went away
        call = 0
        while True:  # the quiet calls go on for `quiet_s` seconds at least
            call += 1
            if call == loaded + 1:
                load.stop()  # the load goes away
                stopped = time.perf_counter()
            long_enough = stopped is not None and time.perf_counter() - stopped >= quiet_s
            if call > loaded + quiet and long_enough:
                break
            inputs = pool[call % POOL]
            start = time.perf_counter()
            answer = compiled(*inputs)
            seconds.append(time.perf_counter() - start)
            now = servers(backend)
            if now != last:
                after = None if stopped is None else round(time.perf_counter() - stopped, 3)
                out["servers"].append({"call": call, "servers": now, "s": after})
                last = now
            if call % every == 0:
                wrong, err = _wrong(answer, model(*inputs))
                out["checked"] += 1
                out["max_error"] = max(out["max_error"], err)
                if wrong:
                    out["wrong"].append({"call": call, "servers": now, "error": err})
        out["calls"] = call - 1
        out["report"] = backend.report.summary()
        out["attempts"] = [
            [{"backend": a.backend, "status": a.status.value, "reason": a.reason[:300]}
             for a in g.attempts]
            for g in backend.report.graphs
        ]  # fmt: skip
        out["call_ms"] = {  # each call as the caller saw it (checks and switches included)
            "loaded_median": 1e3 * statistics.median(seconds[:loaded]),
            "quiet_median": 1e3 * statistics.median(seconds[loaded:]),
            "quiet_last_200_median": 1e3 * statistics.median(seconds[-200:]),
        }
        out["retime"] = retime(model, pool[0], compiled, alone(spec["chain"]), spec["retime_s"])
    return out


def retime(
    model: nn.Module, inputs: tuple[Any, ...], chained: Any, names: list[str], budget_s: float
) -> dict[str, Any]:
    """Quiet: each backend alone and the chain as it serves now, timed in one interleaved
    run (random order, rounds of short blocks). A backend that fails to compile or run is a
    reason, not a figure."""
    from backends.registry import registry
    from chain.judge.rounds import measure

    fns: dict[str, Any] = {"chain": chained}
    failed: dict[str, str] = {}
    for name in names:
        try:
            fn = torch.compile(model, backend="eager" if name == "eager" else registry.lookup(name))
            fn(*inputs)
            fns[name] = fn
        except Exception as error:  # one backend failing here is its row's reason
            failed[name] = f"{type(error).__name__}: {str(error).strip()[:200]}"
    timings = measure(fns, inputs, baseline="eager", budget_s=budget_s, min_rounds=30)
    noisy = sorted({why for t in timings.values() if t.evidence for why in t.evidence.noisy})
    return {
        "ms": {name: t.median_ms for name, t in timings.items()},
        "spread_ms": {name: t.spread_ms for name, t in timings.items()},
        "failed": failed,
        "noisy": noisy,
    }


def first(spec: dict[str, Any]) -> dict[str, Any]:
    """One fresh process's first call, from torch.compile to its answer: the chain (with the
    store the environment names) or compile(backend="eager"); for the chain, how many graphs
    were remembered and who serves them."""
    model, pool = build(spec["model"], spec["quick"])
    backend: Any = "eager" if spec["backend"] == "eager" else make_chain(spec["backend"])
    with torch.no_grad():
        first_s, _ = _timed_first(lambda: torch.compile(model, backend=backend)(*pool[0]))
    if isinstance(backend, str):
        return {"first_s": first_s}
    graphs = backend.report.graphs
    remembered = sum(any(n.startswith("remembered:") for n in g.notes) for g in graphs)
    return {"first_s": first_s, "remembered": remembered, "servers": servers(backend)}


def main() -> None:
    """`busy_cell.py serve|first JSON`: run that part, print its result as JSON."""
    part, spec = sys.argv[1], json.loads(sys.argv[2])
    print(json.dumps({"serve": serve, "first": first}[part](spec)))


if __name__ == "__main__":
    main()
