"""Where a launch-bound call's time goes: ONNX Runtime alone, dynamo's floor, our runner,
the chain's guard with and without its checks.

Models (`chain.bench.real_models`): `mlp_b1` (24 Linear+GELU layers of 256, batch 1) and
`gpt2_decode` (one KV-cache decode step of a 4-layer GPT-2, batch 1). Per model, the
median ms per call of, side by side in one process:

- `direct`: ONNX Runtime on `torch.onnx.export(model, dynamo=True)` of the whole model,
  bare `sess.run` on numpy views, the backend's session options;
- `floor`: `torch.compile` with a do-nothing backend (it returns the outputs computed
  once): dynamo's own per-call cost over the same graph, its guards and argument lists;
- `floor[noguard]`: the same under `torch.compiler.set_stance(skip_guard_eval_unsafe=True)`
  (entered per call): what of the floor is dynamo's guard evaluation;
- `dyn+direct`: `direct` returned by a do-nothing backend: dynamo's floor and ONNX Runtime
  in one call (dynamo's part runs after ONNX Runtime has taken the caches, as it does in
  front of any backend);
- `graph`: a bare `sess.run` on the backend's own ONNX model (the model's part), and
  `dyn+graph`, the same returned by a do-nothing backend (the floor of our runner);
- `runner`: the onnxruntime backend's compiled callable called directly, no dynamo, and
  `runner[noweights]`, its CPU call without the per-call check of the frozen weights;
- `ort`: `torch.compile(model, backend=<onnxruntime>)`: the winner run alone;
- `chain[nochecks]`: `chain("onnxruntime", "eager", watch=False)`: the guard alone;
- `chain`: the default chain (`backend="chain"`'s backends here), checks on;
- `fastest`: `chain("onnxruntime", "inductor", "eager", mode="fastest")`, and
  `fastest:alone`, its winner compiled alone (omitted when that is `ort`);
- `program`: the deploy path, no dynamo: `chain.export(model, args)` through
  `chain("onnxruntime", "eager")`, saved, `chain.load`ed, its `module()` called.

Then the factors: `program / direct` (the route around dynamo), `ort / (floor + direct)`
and `ort / dyn+direct` (our ONNX Runtime path against what dynamo and ONNX Runtime cost by
themselves), `chain / ort` and `fastest / alone`
(the chain against its winner run alone), the microseconds each layer adds, and what the
runner's per-call check of its frozen weights costs (identity and version of each, timed
in a loop). Each round every variant makes one
untimed call, then `--calls` timed ones, in rotated order; medians over `--rounds`; the chains
first make `--warmup` calls (past their early re-verifications: calls 2, 4, ..., 4096). The load
average before and after is printed: a figure from a busy machine is not a figure.

    python benchmarks/launch_overhead.py [--models mlp_b1 gpt2_decode] [--rounds 200]
        [--calls 20] [--warmup 4096] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a plain script

from backends.common.ort_session import session_options
from backends.registry import lookup_backend
from chain import chain
from chain.bench.real_models import REAL_SUITE
from chain.dynamo import default_backends

MODELS = ("mlp_b1", "gpt2_decode")
CHAINS: list[tuple[str, Any]] = []  # the model's chains, for their run-time check counters
Run = Callable[[], Any]


def direct_session(model: torch.nn.Module, args: tuple[torch.Tensor, ...], threads: Any) -> Run:
    """ONNX Runtime on the whole model's export, `sess.run` on numpy views, nothing else."""
    import onnxruntime as ort

    from backends.common.quiet import quiet

    with quiet():
        program = torch.onnx.export(model, args, dynamo=True, verbose=False, report=False)
    data = program.model_proto.SerializeToString()
    session = ort.InferenceSession(data, session_options("all", threads), ["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    outputs = [o.name for o in session.get_outputs()]
    if len(names) != len(args):
        raise RuntimeError(f"direct export takes {len(names)} inputs, the model {len(args)}")
    feeds = dict(zip(names, (a.numpy() for a in args), strict=True))
    return lambda: session.run(outputs, feeds)


def compiled(model: torch.nn.Module, backend: Any, args: tuple[torch.Tensor, ...]) -> Run:
    """`torch.compile(model, backend=backend)`, compiled by one call, as a no-argument run."""
    fn = torch.compile(model, backend=backend)
    fn(*args)
    return lambda: fn(*args)


def variants(
    model: torch.nn.Module, args: tuple[torch.Tensor, ...], threads: int | None
) -> tuple[dict[str, Run], dict[str, str], Any]:
    """Every variant of the table, compiled and ready; the winners the chains chose; and the
    onnxruntime backend's runner."""
    options = {"intra_op_num_threads": threads} if threads else {}
    ort_backend = lookup_backend("onnxruntime")
    built: list[tuple[Any, list[Any]]] = []

    def ours(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        runner = ort_backend(gm, example_inputs, **options)
        built.append((runner, list(example_inputs)))
        return runner

    def nothing(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        out = gm(*example_inputs)
        return lambda *_: out

    direct = direct_session(model, args, threads)
    runs: dict[str, Run] = {"direct": direct}
    runs["floor"] = floor = compiled(model, nothing, args)

    def unguarded() -> Any:
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
            return floor()

    runs["floor[noguard]"] = unguarded
    runs["dyn+direct"] = compiled(model, lambda gm, ex: lambda *_: direct(), args)
    runs["ort"] = compiled(model, ours, args)
    if len(built) != 1:
        raise RuntimeError(f"expected one graph, dynamo made {len(built)}")
    runner, inputs = built[0]
    runs["graph"] = graph = bare_run(runner, inputs)
    runs["dyn+graph"] = compiled(model, lambda gm, ex: lambda *_: graph(), args)
    runs["runner"] = lambda: runner(*inputs)
    runs["runner[noweights]"] = unchecked_run(runner, inputs)
    common = {"options": {"onnxruntime": options}, "memory": False}
    plain = chain("onnxruntime", "eager", watch=False, **common)
    runs["chain[nochecks]"] = compiled(model, plain, args)
    default = chain(*default_backends(), **common)
    runs["chain"] = compiled(model, default, args)
    fastest = chain("onnxruntime", "inductor", "eager", mode="fastest", **common)
    runs["fastest"] = compiled(model, fastest, args)
    winners = {"chain": _winner(default), "fastest": _winner(fastest)}
    CHAINS[:] = [("chain[nochecks]", plain), ("chain", default), ("fastest", fastest)]
    if winners["fastest"] not in ("onnxruntime", "eager"):
        runs["fastest:alone"] = compiled(model, lookup_backend(winners["fastest"]), args)
    runs["program"] = loaded_program(model, args, options)
    return runs, winners, runner


def loaded_program(model: torch.nn.Module, args: tuple[torch.Tensor, ...], options: Any) -> Run:
    """The deploy path: the model exported with ONNX Runtime parts, saved, loaded, called."""
    backend = chain("onnxruntime", "eager", options={"onnxruntime": options}, memory=False)
    result = chain.export(model, args, backend=backend)  # the factory carries export and load
    with tempfile.TemporaryDirectory() as folder:
        torch.export.save(result.program, Path(folder) / "program.pt2")
        module = chain.load(Path(folder) / "program.pt2").module()
    return lambda: module(*args)


def bare_run(runner: Any, inputs: list[Any]) -> Run:
    """`sess.run` on the runner's own session and feeds, nothing else."""
    graph = runner.graph
    names = list(graph.output_names)
    pairs = zip(graph.input_names, graph.input_positions, strict=True)
    feeds = {name: inputs[i].numpy() for name, i in pairs}
    return lambda: runner.session.run(names, feeds)


def unchecked_run(runner: Any, inputs: list[Any]) -> Run:
    """The runner's CPU call without its check of the frozen weights: numpy views in, each
    call, and `torch.from_numpy` out, on its own session."""
    graph = runner.graph
    names = list(graph.output_names)
    pairs = tuple(zip(graph.input_names, graph.input_positions, strict=True))
    run = runner.session.run

    def call() -> Any:
        outs = run(names, {name: inputs[i].numpy() for name, i in pairs})
        return tuple(map(torch.from_numpy, outs))

    return call


def frozen_check_us(runner: Any, loops: int = 20000) -> tuple[int, float]:
    """The runner's per-call check of its frozen weights (identity and version of each, as
    `OrtRunner.__call__` does it), in us, timed in a warm loop; and how many weights."""
    import operator

    from backends.onnxruntime.runtime import _version

    frozen = runner._frozen
    got, tensors, versions = frozen.tensors, frozen.tensors, frozen.versions
    start = time.perf_counter()
    for _ in range(loops):
        all(map(operator.is_, got, tensors)) and tuple(map(_version, tensors)) == versions
    return len(tensors), (time.perf_counter() - start) * 1e6 / loops


def _winner(backend: Any) -> str:
    """The one graph's winner (the table is per graph: one graph expected)."""
    graphs = backend.report.graphs
    if len(graphs) != 1:
        raise RuntimeError(f"expected one graph, the chain compiled {len(graphs)}")
    return str(graphs[0].winner)


def time_rounds(runs: dict[str, Run], rounds: int, calls: int, warmup: int) -> dict[str, float]:
    """Median ms per call of each variant: rotated order, one untimed call before each. The
    chains first make `warmup` calls: the early re-verifications (calls 2, 4, 8, ...) are
    behind them, and the timed ones are as many as `reverify_rate` pays for (a round that
    holds one is slow; the median leaves it out)."""
    for key, run in runs.items():
        for _ in range(warmup if key.startswith(("chain", "fastest")) else 5):
            run()
    times: dict[str, list[float]] = {k: [] for k in runs}
    keys = list(runs)
    for r in range(rounds):
        for key in keys[r % len(keys) :] + keys[: r % len(keys)]:
            run = runs[key]
            run()
            start = time.perf_counter()
            for _ in range(calls):
                run()
            times[key].append((time.perf_counter() - start) * 1e3 / calls)
    return {k: statistics.median(v) for k, v in times.items()}


def factors(
    row: dict[str, float], winners: dict[str, str], frozen: tuple[int, float]
) -> list[tuple[str, str]]:
    """The factor lines of one model: ratios and the microseconds each layer adds."""
    us = {k: v * 1e3 for k, v in row.items()}
    fastest = winners["fastest"]
    alone = row.get("fastest:alone", row["ort"] if fastest == "onnxruntime" else None)
    floor = row["floor"] + row["direct"]
    return [
        ("program / direct", f"{row['program'] / row['direct']:.3f} (deploy path, no dynamo)"),
        ("graph / direct", f"{row['graph'] / row['direct']:.3f} (our ONNX model, bare session)"),
        ("runner - graph", f"{us['runner'] - us['graph']:+.1f} us (our runner's own work)"),
        ("  frozen weights", f"{us['runner'] - us['runner[noweights]']:+.1f} us in place"),
        ("", f"{frozen[1]:.1f} us for {frozen[0]} weights in a warm loop"),
        ("floor", f"{us['floor']:.1f} us (dynamo alone: guards, arguments, wrappers)"),
        ("  its guards", f"{us['floor'] - us['floor[noguard]']:.1f} us (at least)"),
        ("dyn+direct - direct", f"{us['dyn+direct'] - us['direct']:+.1f} us (dynamo before ORT)"),
        ("ort - runner", f"{us['ort'] - us['runner']:+.1f} us (dynamo before our runner)"),
        ("ort - dyn+graph", f"{us['ort'] - us['dyn+graph']:+.1f} us (our runner, under dynamo)"),
        ("ort / (floor + direct)", f"{row['ort'] / floor:.3f} (target <= 1.10)"),
        ("ort / dyn+direct", f"{row['ort'] / row['dyn+direct']:.3f}"),
        ("ort / dyn+graph", f"{row['ort'] / row['dyn+graph']:.3f}"),
        ("chain[nochecks] / ort", f"{row['chain[nochecks]'] / row['ort']:.3f} (the guard)"),
        ("chain / chain[nochecks]", f"{row['chain'] / row['chain[nochecks]']:.3f} (the checks)"),
        ("chain / ort", f"{row['chain'] / row['ort']:.3f} (won: {winners['chain']}; <= 1.03)"),
        (
            "fastest / alone",
            f"{row['fastest'] / alone:.3f} (won: {fastest}; <= 1.03)"
            if alone is not None
            else f"won: {fastest}, nothing to compare",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(REAL_SUITE))
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--calls", type=int, default=20, help="timed calls per variant a round")
    parser.add_argument("--warmup", type=int, default=4096, help="untimed calls of each chain")
    parser.add_argument("--threads", type=int, default=1, help="torch and ORT threads (0: theirs)")
    ns = parser.parse_args(argv)
    threads = ns.threads or None
    if threads:
        torch.set_num_threads(threads)
    os.environ.setdefault("CHAIN_MEMORY", "0")
    # every variant compiles the same forward with its own backend: one cache entry each,
    # past dynamo's 8 a variant would run eager
    torch._dynamo.config.recompile_limit = 64
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, ORT threads {threads}")
    for name in ns.models:
        spec = REAL_SUITE[name]
        if reason := spec.available():
            print(f"{name}: skipped: {reason}")
            continue
        model, args = spec.build(None, torch.device("cpu"), torch.float32)
        torch._dynamo.reset()
        with torch.no_grad():
            runs, winners, runner = variants(model, args, threads)
            load = os.getloadavg()[0]
            row = time_rounds(runs, ns.rounds, ns.calls, ns.warmup)
        after = os.getloadavg()[0]
        print(f"\n{name} ({spec.doc}): {ns.rounds} rounds x {ns.calls} calls, interleaved")
        print(f"load average (1 min) before {load:.2f}, after {after:.2f}")
        print(" | ".join(f"{k:>15}" for k in row))
        print(" | ".join(f"{v:>12.4f} ms" for v in row.values()))
        for label, text in factors(row, winners, frozen_check_us(runner)):
            print(f"  {label:<24} {text}")
        for label, backend in CHAINS:
            print(f"  {label}: {backend.report.graphs[0].watch}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
