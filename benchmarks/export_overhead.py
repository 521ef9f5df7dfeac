"""The deploy path vs ONNX Runtime itself: a loaded exported program's call, and where the gap goes.

Models (from `benchmarks/ort_overhead.py`, small configs, random weights): DistilBERT,
ConvNeXt, Swin. Each is exported with chain("onnxruntime", "eager"), saved, loaded with
`chain.load`; then, side by side in one process, the median latency of:

- `direct`: a bare `sess.run` on `torch.onnx.export(model, dynamo=True)` (same options);
- `session`: a bare `sess.run` on the payload's own ONNX model (the graph's part);
- `runner`: the payload's runner (`chain.deploy.ops.runner_for`): I/O binding;
- `op`: `torch.ops.backend_chain.run_payload` on the payload: op dispatch;
- `program`: the loaded program's `module()(*args)`: the program call.

Rounds interleave the variants in rotated order (`ort_overhead.time_runs`). Attribution,
per model: session - direct, runner - session, op - runner, program - op (ms per call).

    python benchmarks/export_overhead.py [--models distilbert convnext swin]
        [--rounds 30] [--calls 5]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import chain
from backends.common.ort_session import session_options
from backends.common.payload import tensor_bytes, unpack
from benchmarks.ort_overhead import MODELS, bare_run, direct_model, ort_session, time_runs
from chain.deploy import ops

OP = torch.ops.backend_chain.run_payload.default
STEPS = (("graph", "session", "direct"), ("I/O binding", "runner", "session"),
         ("op dispatch", "op", "runner"), ("program call", "program", "op"))  # fmt: skip


def variants(model: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> dict[str, Callable]:
    """The five variants of the table, built and ready."""
    device = args[0].device
    result = chain.export(model, args, backend=chain.chain("onnxruntime", "eager", measure=False))
    with tempfile.TemporaryDirectory() as folder:
        torch.export.save(result.program, Path(folder) / "program.pt2")
        program = chain.load(Path(folder) / "program.pt2")
    module = program.module()
    direct = ort_session(direct_model(model, args), session_options(), device)
    runs: dict[str, Callable] = {"direct": bare_run(direct, device)}
    calls = [n for n in program.graph.nodes if n.target is OP]
    users = {name: k for k, name in enumerate(program.graph_signature.user_inputs)}
    if len(calls) == 1 and all(a.name in users for a in calls[0].args[0]):
        node = calls[0]
        positions = [users[a.name] for a in node.args[0]]
        specs = {s.arg.name: s.target for s in program.graph_signature.input_specs}
        payload = program.constants[specs[node.args[1].name]]
        outputs = node.args[2]
        _, body = unpack(tensor_bytes(payload))
        session = ort_session(bytes(body), session_options(), device)
        runner = ops.runner_for(payload, device, outputs)

        def pick(xs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
            return [xs[p] for p in positions]

        bare = bare_run(session, device)
        runs["session"] = lambda *xs: bare(*pick(xs))
        runs["runner"] = lambda *xs: runner(pick(xs))
        runs["op"] = lambda *xs: OP(pick(xs), payload, outputs)
    else:
        print(f"  ({len(calls)} payload calls: session/runner/op variants left out)")
    runs["program"] = module
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["distilbert", "convnext", "swin"])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=5)
    ns = parser.parse_args()
    ratios: list[float] = []
    rows: list[tuple[str, dict[str, float]]] = []
    for name in ns.models:
        torch.manual_seed(0)
        model, args = MODELS[name]()
        model.eval()
        with torch.no_grad():
            runs = variants(model, args)
            med = time_runs(runs, args, ns.rounds, ns.calls)
        rows.append((name, med))
        ratios.append(med["program"] / med["direct"])
    keys = ["direct", "session", "runner", "op", "program"]
    print(f"{'model':12}" + "".join(f"{k:>10}" for k in keys) + f"{'program/direct':>16}")
    for name, med in rows:
        cells = "".join(f"{med[k]:10.3f}" if k in med else f"{'-':>10}" for k in keys)
        print(f"{name:12}{cells}{med['program'] / med['direct']:16.3f}")
    print(f"geomean program/direct: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}")
    print("attribution (ms per call):")
    for name, med in rows:
        parts = [f"{label} {med[a] - med[b]:+.3f}" for label, a, b in STEPS if a in med]
        print(f"  {name:12} " + ", ".join(parts))


if __name__ == "__main__":
    main()
