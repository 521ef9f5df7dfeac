"""How close the onnxruntime backend gets to ONNX Runtime itself, and where the gap goes.

Models: transformers DistilBERT (3 layers, 4x48 tokens), ConvNeXt and Swin (batch 8,
64x64 images), from small configs with random weights, and the suite's bert/gpt/vit
(`benchmarks/models.py`). Per model, the median latency of, side by side in one process:

- `direct`: ONNX Runtime on `torch.onnx.export(model, args, dynamo=True)`, bare
  `sess.run`, with the backend's session options (`--sweep` compares session options);
- `graph`: a bare session on the backend's own ONNX model, same options (the graph's part);
- `runner`: the backend's compiled callable without dynamo (its per-call Python work);
- `compile`: `torch.compile(m, backend=onnxruntime)` (adds dynamo's per-call cost);
- `dyn+direct`: the direct session returned by a torch.compile backend (dynamo's cost alone);
- `chain`: `torch.compile(m, backend=chain("onnxruntime", "eager"))`;
- `chain[noguard]`: the same compiled model under PyTorch's
  `torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)` (dynamo's guards
  skipped: what is left of dynamo's cost is its argument gathering and wrappers);
- `eager`, timed after the others (torch's idle OpenMP threads spin and would slow
  whichever variant comes next).

Each round, every variant makes one untimed call (so it is not charged for the previous
variant's caches or threads), then `--calls` timed calls; medians over `--rounds` rounds,
variants in rotated order. `--graphs` prints, per model, the node count and op histogram
of both ONNX models after ONNX Runtime's optimizations (fusions show as Attention,
SkipLayerNormalization, FusedMatMul, ...).

    python benchmarks/ort_overhead.py [--models distilbert convnext swin bert gpt vit]
        [--rounds 30] [--calls 5] [--threads N] [--spin] [--graphs] [--busy]

`--busy` keeps one extra process spinning on a core while timing (a shared machine).
`--device cuda` times on CUDA (fp16 with `--half`), the direct run with IOBinding on
torch memory.
"""

from __future__ import annotations

import argparse
import collections
import math
import multiprocessing
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends import lookup_backend
from backends.common.onnx_export import quiet
from backends.common.ort_session import session_options
from backends.onnxruntime.session import default_providers
from chain.bench.models import SUITE

Built = tuple[nn.Module, tuple[torch.Tensor, ...]]


class Unwrapped(nn.Module):
    """A transformers model returning a plain tuple (the direct export wants tensors out)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(*args)
        return tuple(v for v in out.values() if isinstance(v, torch.Tensor))


def distilbert() -> Built:
    from transformers import DistilBertConfig, DistilBertModel

    config = DistilBertConfig(
        vocab_size=1000, dim=256, n_layers=3, n_heads=4, hidden_dim=1024,
        max_position_embeddings=128,
    )  # fmt: skip
    ids = torch.randint(0, 1000, (4, 48))
    return Unwrapped(DistilBertModel(config)), (ids, torch.ones(4, 48, dtype=torch.long))


def convnext() -> Built:
    from transformers import ConvNextConfig, ConvNextModel

    config = ConvNextConfig(
        hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 2, 1], image_size=64, num_labels=10
    )
    return Unwrapped(ConvNextModel(config)), (torch.randn(8, 3, 64, 64),)


def swin() -> Built:
    from transformers import SwinConfig, SwinModel

    config = SwinConfig(
        image_size=64, patch_size=4, embed_dim=32, depths=[1, 2, 2],
        num_heads=[2, 4, 8], window_size=4,
    )  # fmt: skip
    return Unwrapped(SwinModel(config)), (torch.randn(8, 3, 64, 64),)


def suite(name: str) -> Callable[[], Built]:
    return lambda: SUITE[name].builder(8, False)


MODELS: dict[str, Callable[[], Built]] = {
    "distilbert": distilbert,
    "convnext": convnext,
    "swin": swin,
    **{name: suite(name) for name in ("bert", "gpt", "vit")},
}


def ort_session(model: bytes, options: Any, device: torch.device) -> Any:
    import onnxruntime as ort

    return ort.InferenceSession(model, options, providers=default_providers(device))


def bare_run(session: Any, device: torch.device) -> Callable[..., Any]:
    """`sess.run` on numpy views (CPU) or IOBinding on torch memory (CUDA), nothing else."""
    names = [i.name for i in session.get_inputs()]
    outputs = [o.name for o in session.get_outputs()]
    if device.type == "cpu":

        def run(*xs: torch.Tensor) -> Any:
            return session.run(outputs, {n: x.numpy() for n, x in zip(names, xs, strict=True)})

        return run
    from backends.onnxruntime.runtime import numpy_dtype

    binding = session.io_binding()

    def run_cuda(*xs: torch.Tensor) -> Any:
        for n, x in zip(names, xs, strict=True):
            binding.bind_input(n, "cuda", 0, numpy_dtype(x.dtype), tuple(x.shape), x.data_ptr())
        for o in outputs:
            binding.bind_output(o, "cuda", 0)
        session.run_with_iobinding(binding)
        return binding.get_outputs()

    return run_cuda


def direct_model(model: nn.Module, args: tuple[torch.Tensor, ...]) -> bytes:
    with quiet():
        program = torch.onnx.export(model, args, dynamo=True, verbose=False, report=False)
    return program.model_proto.SerializeToString()


def variants(
    model: nn.Module, args: tuple[torch.Tensor, ...], options: dict[str, Any]
) -> tuple[dict[str, Callable], dict[str, bytes]]:
    """Every variant of the table, compiled and ready, and the two ONNX models."""
    from chain import chain

    device = args[0].device
    ort_backend = lookup_backend("onnxruntime")
    built: list[tuple[Callable, list[Any]]] = []

    def ours(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
        runner = ort_backend(gm, example_inputs, **options)
        built.append((runner, list(example_inputs)))
        return runner

    compiled = torch.compile(model, backend=ours)
    compiled(*args)
    if len(built) != 1:
        raise RuntimeError(f"expected one graph, dynamo made {len(built)}")
    runner, inputs = built[0]
    fed = [inputs[i] for i in runner.graph.input_positions]
    threads = options.get("intra_op_num_threads")
    spin = options.get("allow_spinning", False)
    ours_options = session_options("all", threads, spin)
    direct_bytes = direct_model(model, args)
    direct = bare_run(ort_session(direct_bytes, ours_options, device), device)
    graph = bare_run(ort_session(runner.chain_payload, ours_options, device), device)
    backend = chain("onnxruntime", "eager", options={"onnxruntime": options}, measure=False)
    chained = torch.compile(model, backend=backend)
    chained(*args)  # compiled with guards: the unguarded stance only skips their evaluation

    def through_dynamo(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
        return lambda *_: direct(*args)

    def unguarded(*xs: torch.Tensor) -> Any:
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
            return chained(*xs)

    runs = {
        "direct": lambda *_: direct(*args),
        "graph": lambda *_: graph(*fed),
        "runner": lambda *_: runner(*inputs),
        "compile": compiled,
        "dyn+direct": torch.compile(model, backend=through_dynamo),
        "chain": chained,
        "chain[noguard]": unguarded,
    }
    return runs, {"ours": runner.chain_payload, "direct": direct_bytes}


def time_rounds(
    runs: dict[str, Callable], args: tuple[torch.Tensor, ...], rounds: int, calls: int
) -> dict[str, list[float]]:
    """Per round, ms per call of each variant: rotated order, one untimed call before each.

    Kept per round (not only medians) so that ratios can be paired within a round: on a
    shared machine the load drifts between rounds, less within one.
    """
    cuda = args[0].is_cuda
    for fn in runs.values():
        for _ in range(3):
            fn(*args)
    times: dict[str, list[float]] = {k: [] for k in runs}
    keys = list(runs)
    for r in range(rounds):
        order = keys[r % len(keys) :] + keys[: r % len(keys)]
        for key in order:
            fn = runs[key]
            fn(*args)
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                fn(*args)
            if cuda:
                torch.cuda.synchronize()
            times[key].append((time.perf_counter() - start) * 1e3 / calls)
    return times


def time_runs(
    runs: dict[str, Callable], args: tuple[torch.Tensor, ...], rounds: int, calls: int
) -> dict[str, float]:
    """Median ms per call of each variant, interleaved in rotated order."""
    return {k: statistics.median(v) for k, v in time_rounds(runs, args, rounds, calls).items()}


SWEEP = {  # session option variants of the direct model: (intra-op threads, spinning)
    "1 thread": (1, False),
    "2 threads": (2, False),
    "2 threads+spin": (2, True),
    "ORT defaults": (None, None),
}


def sweep_runs(model: nn.Module, args: tuple[torch.Tensor, ...]) -> dict[str, Callable]:
    """The direct model under each session option variant of SWEEP."""
    device = args[0].device
    data = direct_model(model, args)
    runs: dict[str, Callable] = {}
    for label, (threads, spin) in SWEEP.items():
        options = None if spin is None else session_options("all", threads, spin)
        run = bare_run(ort_session(data, options, device), device)
        runs[label] = lambda *_, run=run: run(*args)
    return runs


def optimized_ops(
    model: bytes, options: dict[str, Any], device: torch.device
) -> collections.Counter:
    """Op histogram of the model after ONNX Runtime's graph optimizations."""
    import onnx

    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "optimized.onnx")
        so = session_options("all", options.get("intra_op_num_threads"))
        so.optimized_model_filepath = path
        ort_session(model, so, device)
        proto = onnx.load(path)
    return collections.Counter(n.op_type for n in proto.graph.node)


def print_graphs(name: str, models: dict[str, bytes], options: dict[str, Any], device: Any) -> None:
    import onnx

    for which, data in models.items():
        proto = onnx.load_from_string(data)
        raw = collections.Counter(n.op_type for n in proto.graph.node)
        inputs = [i.name for i in proto.graph.input]
        opt = optimized_ops(data, options, device)
        print(
            f"{name:>10} {which:>6}: exported {sum(raw.values())} nodes, "
            f"{len(proto.graph.initializer)} initializers, {len(inputs)} inputs; "
            f"after ORT {sum(opt.values())} nodes: "
            + ", ".join(f"{k} {v}" for k, v in opt.most_common())
        )


def print_sweep(rows: list[dict[str, Any]], keys: list[str], ns: argparse.Namespace) -> None:
    print(
        f"direct model, median ms per call, {ns.rounds} rounds x {ns.calls} calls, interleaved, "
        f"torch threads {torch.get_num_threads()}, other core {'busy' if ns.busy else 'free'}"
    )
    print(" | ".join(f"{h:>14}" for h in ["model", *keys]))
    for row in rows:
        print(" | ".join(f"{c:>14}" for c in [row["model"], *(f"{row[k]:.3f}" for k in keys)]))


def _spin(stop: Any) -> None:
    while not stop.is_set():
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=5, help="timed calls per variant per round")
    parser.add_argument("--threads", type=int, default=None, help="ORT intra-op threads")
    parser.add_argument("--spin", action="store_true", help="let ORT's idle threads spin")
    parser.add_argument("--graphs", action="store_true", help="print optimized op histograms")
    parser.add_argument("--busy", action="store_true", help="keep one core busy meanwhile")
    parser.add_argument(
        "--sweep", action="store_true", help="time session option variants of the direct model"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--half", action="store_true", help="fp16 (CUDA)")
    ns = parser.parse_args()
    device = torch.device(ns.device)
    options: dict[str, Any] = {"allow_spinning": ns.spin}
    if ns.threads is not None:
        options["intra_op_num_threads"] = ns.threads
    stop = multiprocessing.Event()
    busy = multiprocessing.Process(target=_spin, args=(stop,), daemon=True)
    if ns.busy:
        busy.start()
    rows = []
    try:
        for name in ns.models:
            torch.manual_seed(0)
            model, args = MODELS[name]()
            dtype = torch.float16 if ns.half else torch.float32
            model = model.eval().to(device, dtype)
            args = tuple(a.to(device, dtype if a.is_floating_point() else a.dtype) for a in args)
            torch._dynamo.reset()
            with torch.inference_mode():
                if ns.sweep:
                    runs = sweep_runs(model, args)
                else:
                    runs, graphs = variants(model, args, options)
                    if ns.graphs:
                        print_graphs(name, graphs, options, device)
                eager = runs.pop("eager", model)
                row = {"model": name, **time_runs(runs, args, ns.rounds, ns.calls)}
                row.update(time_runs({"eager": eager}, args, max(3, ns.rounds // 5), ns.calls))
                rows.append(row)
    finally:
        stop.set()
    keys = [k for k in rows[0] if k != "model"]
    if ns.sweep:
        print_sweep(rows, keys, ns)
        return
    print(
        f"median ms per call, {ns.rounds} rounds x {ns.calls} calls, interleaved, one process; "
        f"torch threads {torch.get_num_threads()}, ORT threads {ns.threads or 'default'}, "
        f"spinning {'on' if ns.spin else 'off'}, other core {'busy' if ns.busy else 'free'}"
    )
    ratios = {  # the gap, factor by factor: graph, runner, dynamo (guards and the rest), chain
        "chain/direct": ("chain", "direct"),
        "graph/direct": ("graph", "direct"),
        "runner/graph": ("runner", "graph"),
        "compile/runner": ("compile", "runner"),
        "chain/compile": ("chain", "compile"),
        "dyn+direct/direct": ("dyn+direct", "direct"),
        "chain/dyn+direct": ("chain", "dyn+direct"),
        "noguard/direct": ("chain[noguard]", "direct"),
    }
    print(" | ".join(f"{h:>12}" for h in ["model", *keys, *ratios]))
    for row in rows:
        cells = [row["model"], *(f"{row[k]:.3f}" for k in keys)]
        cells += [f"{row[a] / row[b]:.3f}" for a, b in ratios.values()]
        print(" | ".join(f"{c:>12}" for c in cells))
    for label in ("chain/direct", "dyn+direct/direct", "chain/dyn+direct", "noguard/direct"):
        a, b = ratios[label]
        geomean = math.exp(sum(math.log(row[a] / row[b]) for row in rows) / len(rows))
        print(f"{label} geomean {geomean:.3f}")


if __name__ == "__main__":
    main()
