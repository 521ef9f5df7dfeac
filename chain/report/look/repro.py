"""A standalone repro of one backend on one graph of a saved report.

`python -m chain repro run.json GRAPH BACKEND -o dir/` writes `graph.py` (the graph
module, as dynamo's minifier writes it), `inputs.pt` (random data of the recorded input
specs), `expected.json` (the backend, where it comes from, the recorded status and reason:
every string taken from the report is there, as data) and `repro.py`, a fixed script that
reads expected.json and reruns that backend on that graph through a one-backend chain in a
fresh process, printing the status and reason it gets and whether they are the recorded
ones. Nothing from the report is pasted into repro.py.

Running the repro runs code recorded in the report: `graph.py` is the report's `code`
field, and the backend is imported from the module or loaded from the script file the
report names. So `chain repro` asks for `--trust` for a report you did not make
(`made_by_you`: one without this machine's keyed tag, `provenance`; a downloaded
report is a file you own, which proves nothing).
"""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from backends.common.files import atomic_write, read_bounded
from chain.report.records import GraphRecord, Status
from chain.report.report import Report

HEADER = """import torch
from torch import tensor, device
from math import inf, nan
"""

SCRIPT = '''"""Repro of one backend on one graph of a saved report (`python -m chain repro`).

What it reruns and what was recorded are in expected.json beside this file. It runs the
graph code in graph.py and the backend's own code: both come from the report.
Run: python repro.py  (from a folder where the backend's module imports, if it is yours)
Exit code 0 when the recorded status comes back, 1 when it does not.
"""

import importlib
import importlib.util
import json
import os
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), os.getcwd()]

from chain import AllCandidatesFailed, chain  # noqa: E402
from graph import Repro  # noqa: E402

with open(HERE / "expected.json", encoding="utf-8") as f:
    EXPECTED = json.load(f)


def _from_file(path):
    """The user's script, loaded under another name (its `if __name__ == "__main__":`
    block does not run; its top-level code does)."""
    spec = importlib.util.spec_from_file_location("chain_repro_script", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load the backend's script {path!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def shown(text):
    """`text` with control characters escaped: a recorded reason cannot drive the terminal."""
    return "".join(c if c.isprintable() or c == "\\n" else repr(c)[1:-1] for c in str(text))


def backend():
    """The backend by its recorded import path (the user's module or script), else by name."""
    source = EXPECTED["source"]
    if not source:
        return EXPECTED["backend"]
    where, _, name = source.rpartition(":")
    found = _from_file(where) if where.endswith(".py") else importlib.import_module(where)
    for part in name.split("."):
        found = getattr(found, part)
    return found


def main():
    gm = torch.fx.symbolic_trace(Repro())
    inputs = torch.load(HERE / "inputs.pt", weights_only=True)
    one = chain(backend(), measure=EXPECTED["status"] == "slower", eager_floor=False)
    try:
        with torch.no_grad():
            one(gm, inputs)
    except AllCandidatesFailed:
        pass  # the failure is in the record, read below
    attempt = one.report.graphs[0].attempts[0]
    print(f"{attempt.backend}: {attempt.status.value}: {attempt.reason}")
    if attempt.status.value == EXPECTED["status"]:
        print("reproduced: " + EXPECTED["status"])
        return 0
    print(f"not reproduced: recorded {EXPECTED['status']}: {shown(EXPECTED['reason'])}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
'''

MAX_INPUT_BYTES = 1 << 30  # all inputs together: a hostile --size or record is refused
MAX_REPORT_BYTES = 64 << 20  # as Report.load reads
_SIZE_SPEC = re.compile(r"([A-Za-z_][A-Za-z0-9_]{0,63})=([0-9]{1,10})")
_INTS = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"}


class ReproError(ValueError):
    """A repro that cannot be written: no such graph or attempt, no code recorded, a size
    or input spec that is not one, or a report that needs `--trust`."""


def parse_size(text: str) -> tuple[str, int]:
    """One `--size NAME=N` (ASCII name, decimal N up to 2**31 - 1), else ReproError."""
    found = _SIZE_SPEC.fullmatch(text)
    if found is None or int(found[2]) >= 1 << 31:
        raise ReproError(f"--size {text!r}: expected NAME=INTEGER (0 to 2**31-1), e.g. s0=8")
    return found[1], int(found[2])


def made_by_you(path: str | os.PathLike[str]) -> str | None:
    """None when the report at `path` was written by the chain on this machine for this
    user (its keyed tag, `provenance`), whoever owns the file (a downloaded report is
    yours too). Else why not, in words: its repro would run code someone else recorded."""
    from chain.report.look.provenance import why_not_made_here

    try:
        data = json.loads(read_bounded(path, MAX_REPORT_BYTES, follow_symlinks=True))
    except (OSError, ValueError, RecursionError) as error:
        return f"not readable as a report ({type(error).__name__})"
    return why_not_made_here(data)


def _size(dim: Any, sizes: Mapping[str, int]) -> int:
    if isinstance(dim, int) and not isinstance(dim, bool) and dim >= 0:
        return dim
    if isinstance(dim, str) and dim in sizes:
        return sizes[dim]
    if isinstance(dim, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", dim):
        raise ReproError(f"symbolic size {dim!r}: give its value, e.g. --size {dim}=8")
    raise ReproError(f"a recorded size that is not one ({str(dim)[:40]!r})")


def _dtype(name: Any) -> torch.dtype:
    """The torch dtype a recorded spec names; anything else (a function's name) refused."""
    found = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(found, torch.dtype):
        raise ReproError(f"a recorded dtype that is not one ({str(name)[:40]!r})")
    return found


def _scalar(spec: dict[str, Any], sizes: Mapping[str, int]) -> int:
    """A recorded SymInt: its value, the size given for its symbol, else its hint."""
    value = str(spec.get("value"))
    if re.fullmatch(r"-?[0-9]{1,18}", value):
        return int(value)
    if value not in sizes and isinstance(spec.get("hint"), int):
        return int(spec["hint"])  # the value the symbol had when the graph compiled
    return _size(value, sizes)


def example_input(spec: dict[str, Any], sizes: Mapping[str, int], seed: int) -> Any:
    """Random data of a recorded input spec: normal floats, 0/1 integers (valid indices
    and masks), random bools; a size as recorded (a symbol: `sizes`, else its hint)."""
    if not isinstance(spec, dict):
        raise ReproError(f"a recorded input that is not a spec ({type(spec).__name__})")
    if "shape" not in spec:
        return _scalar(spec, sizes)
    if not isinstance(spec["shape"], list):
        raise ReproError("a recorded shape that is not a list")
    shape = [_size(d, sizes) for d in spec["shape"]]
    dtype = _dtype(spec.get("dtype"))
    numel = 1
    for n in shape:
        numel *= n
    if numel * dtype.itemsize > MAX_INPUT_BYTES:
        raise ReproError(f"an input of shape {shape} is over {MAX_INPUT_BYTES >> 20} MiB")
    generator = torch.Generator().manual_seed(seed)
    if dtype is torch.bool:
        data = torch.randint(0, 2, shape, generator=generator).bool()
    elif spec["dtype"] in _INTS:
        data = torch.randint(0, 2, shape, generator=generator, dtype=dtype)
    else:
        data = torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)
    try:
        data = data.to(_device(spec.get("device", "cpu")))
    except ReproError:
        raise
    except Exception as error:  # no such device here, not a device, no CUDA build: one line
        first = str(error).splitlines()[0][:80] if str(error) else type(error).__name__
        raise ReproError(f"a recorded device not usable here ({first})") from None
    return torch.nn.Parameter(data, requires_grad=False) if spec.get("parameter") else data


def _device(text: Any) -> torch.device:
    """The recorded device, if this machine has it; ReproError in one line otherwise (a
    report from elsewhere may name `cuda:7`)."""
    device = torch.device(str(text)[:40])
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            raise ReproError(f"a recorded device not usable here ({device}: {count} CUDA devices)")
    return device


def _inputs(record: GraphRecord, sizes: Mapping[str, int]) -> bytes:
    """`inputs.pt`'s bytes, all inputs bounded together by MAX_INPUT_BYTES."""
    inputs = [example_input(s, sizes, i) for i, s in enumerate(record.inputs)]
    total = sum(x.numel() * x.element_size() for x in inputs if isinstance(x, torch.Tensor))
    if total > MAX_INPUT_BYTES:
        raise ReproError(f"the inputs come to over {MAX_INPUT_BYTES >> 20} MiB")
    buffer = io.BytesIO()
    torch.save(inputs, buffer)
    return buffer.getvalue()


def _graph(report: Report, graph: int) -> GraphRecord:
    found = [g for g in report.graphs if g.id == graph]
    if not found:
        ids = ", ".join(str(g.id) for g in report.graphs) or "none"
        raise ReproError(f"no graph {graph} in the report (graphs: {ids})")
    return found[0]


def _attempt_of(record: GraphRecord, graph: int, backend: str) -> Any:
    """The last attempt of `backend` on the graph, when it is one worth reproducing."""
    attempts = [a for a in record.attempts if a.backend == backend]
    if not attempts:
        tried = ", ".join(repr(a.backend) for a in record.attempts)
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
    return attempt


def write(
    report: Report,
    graph: int,
    backend: str,
    out: str | os.PathLike[str],
    sizes: Mapping[str, int] | None = None,
    source: str = "report",
) -> Path:
    """Write the repro of `backend` on graph `graph` into `out`; returns `out/repro.py`.

    Everything is built before the first write (a bad size or spec leaves no folder);
    every file is written atomically, as a regular file (never through a link).
    """
    record = _graph(report, graph)
    attempt = _attempt_of(record, graph, backend)
    expected = {
        "backend": backend,
        "source": record.sources.get(backend),
        "graph": graph,
        "report": source,
        "status": attempt.status.value,
        "reason": attempt.reason,
    }
    files: dict[str, str | bytes] = {
        "graph.py": HEADER + str(record.code),
        "inputs.pt": _inputs(record, sizes or {}),
        "expected.json": json.dumps(expected, indent=2) + "\n",
        "repro.py": SCRIPT,
    }
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        atomic_write(folder / name, data)
    return folder / "repro.py"
