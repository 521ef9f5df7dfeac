"""A standalone repro of one backend on one graph of a saved report.

`python -m chain repro run.json GRAPH BACKEND -o dir/` writes `graph.py` (the graph
module, as dynamo's minifier writes it), `inputs.pt` (random data of the recorded input
specs), `expected.json` (the recorded status and reason) and `repro.py`, which reruns
that backend on that graph through a one-backend chain in a fresh process and prints
the status and reason it gets, and whether they are the recorded ones.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from chain.records import GraphRecord, Status
from chain.report import Report

HEADER = """import torch
from torch import tensor, device
from math import inf, nan
"""

SCRIPT = '''"""Repro: backend {backend!r} on graph {graph} of {report}.

Recorded: {status}: {reason}
Run: python repro.py  (from a folder where the backend's module imports, if it is yours)
Exit code 0 when the recorded status comes back, 1 when it does not.
"""

import importlib
import json
import os
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), os.getcwd()]

from chain import AllCandidatesFailed, chain  # noqa: E402
from graph import Repro  # noqa: E402

EXPECTED = json.loads((HERE / "expected.json").read_text())


def backend():
    """The backend by its recorded import path (the user's module), else by name."""
    source = EXPECTED["source"]
    if not source:
        return EXPECTED["backend"]
    module, _, name = source.partition(":")
    found = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part)
    return found


def main() -> int:
    gm = torch.fx.symbolic_trace(Repro())
    inputs = torch.load(HERE / "inputs.pt", weights_only=False)
    one = chain(backend(), measure=EXPECTED["status"] == "slower", eager_floor=False)
    try:
        with torch.no_grad():
            one(gm, inputs)
    except AllCandidatesFailed:
        pass  # the failure is in the record, read below
    attempt = one.report.graphs[0].attempts[0]
    print(f"{{attempt.backend}}: {{attempt.status.value}}: {{attempt.reason}}")
    if attempt.status.value == EXPECTED["status"]:
        print("reproduced: " + EXPECTED["status"])
        return 0
    print(f"not reproduced: recorded {{EXPECTED['status']}}: {{EXPECTED['reason']}}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
'''

_INTS = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"}


class ReproError(ValueError):
    """A repro that cannot be written: no such graph or attempt, or no code recorded."""


def _size(dim: int | str, sizes: Mapping[str, int]) -> int:
    if isinstance(dim, int):
        return dim
    if dim in sizes:
        return sizes[dim]
    raise ReproError(f"symbolic size {dim!r}: give its value, e.g. --size {dim}=8")


def example_input(spec: dict[str, Any], sizes: Mapping[str, int], seed: int) -> Any:
    """Random data of a recorded input spec: normal floats, 0/1 integers (valid indices
    and masks), random bools; a size as recorded (a symbol: `sizes`, else its hint)."""
    generator = torch.Generator().manual_seed(seed)
    if "shape" not in spec:
        value = str(spec.get("value"))
        if value.lstrip("-").isdigit():
            return int(value)
        if value not in sizes and isinstance(spec.get("hint"), int):
            return spec["hint"]  # the value the symbol had when the graph compiled
        return _size(value, sizes)
    shape = [_size(d, sizes) for d in spec["shape"]]
    dtype = getattr(torch, spec["dtype"])
    if spec["dtype"] == "bool":
        data = torch.randint(0, 2, shape, generator=generator).bool()
    elif spec["dtype"] in _INTS:
        data = torch.randint(0, 2, shape, generator=generator, dtype=dtype)
    else:
        data = torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)
    data = data.to(spec.get("device", "cpu"))
    return torch.nn.Parameter(data, requires_grad=False) if spec.get("parameter") else data


def _graph(report: Report, graph: int) -> GraphRecord:
    found = [g for g in report.graphs if g.id == graph]
    if not found:
        ids = ", ".join(str(g.id) for g in report.graphs) or "none"
        raise ReproError(f"no graph {graph} in the report (graphs: {ids})")
    return found[0]


def write(
    report: Report,
    graph: int,
    backend: str,
    out: str | os.PathLike[str],
    sizes: Mapping[str, int] | None = None,
    source: str = "report",
) -> Path:
    """Write the repro of `backend` on graph `graph` into `out`; returns `out/repro.py`."""
    record = _graph(report, graph)
    attempts = [a for a in record.attempts if a.backend == backend]
    if not attempts:
        tried = ", ".join(a.backend for a in record.attempts)
        raise ReproError(f"graph {graph} has no attempt of {backend!r} (tried: {tried})")
    attempt = attempts[-1]
    if attempt.status in (Status.UNAVAILABLE, Status.NOT_TRIED):
        raise ReproError(
            f"{backend!r} was {attempt.status.value} on graph {graph}: nothing to reproduce"
        )
    if record.code is None:
        raise ReproError(
            f"graph {graph} has no recorded code (a report from before repros, or the "
            "graph could not be written): rerun the model to record it"
        )
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "graph.py").write_text(HEADER + record.code)
    inputs = [example_input(s, sizes or {}, i) for i, s in enumerate(record.inputs)]
    torch.save(inputs, folder / "inputs.pt")
    expected = {
        "backend": backend,
        "source": record.sources.get(backend),
        "graph": graph,
        "status": attempt.status.value,
        "reason": attempt.reason,
    }
    (folder / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")
    script = folder / "repro.py"
    script.write_text(
        SCRIPT.format(
            backend=backend,
            graph=graph,
            report=source,
            status=attempt.status.value,
            reason=attempt.reason.replace("\\", "\\\\").replace('"""', "'''"),
        )
    )
    return script
