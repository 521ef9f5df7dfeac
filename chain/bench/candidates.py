"""The benchmark's columns as (label, factory) pairs: eager, single backends, chains.

Backends are picked up by name from the registry; one that is not registered on this
checkout, or whose `available()` gives a reason, becomes a row with that reason.
A chain leaves out the names this checkout has not registered (as `backend="chain"` does),
rather than letting them resolve to dynamo's namesakes: dynamo's cudagraphs "wins" on CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx, nn

import backends
from chain import DEFAULT_CHAIN, chain
from chain.bench.harness import Candidate, Compiled
from chain.report.records import GraphRecord, Status
from chain.select.core import MODES

KEPT_QUIET = (Status.WON, Status.NOT_TRIED)

KNOWN_BACKENDS = ("eager", "inductor", "onnxruntime", "cudagraphs", "tensorrt")


def backend_names() -> list[str]:
    """Names `--backends` accepts: the known ones, plus whatever the registry holds."""
    return sorted(set(KNOWN_BACKENDS) | set(backends.registry.names()))


def not_registered(name: str) -> str:
    return f"{name} is not registered in backends/ on this checkout"


def baseline() -> Candidate:
    """The model called as it is, no torch.compile: the reference for error and speedup."""
    return Candidate("eager", "eager", lambda model: Compiled(model))


Options = dict[str, dict[str, Any]]  # backend name -> its options


def thread_options(threads: int | None) -> Options:
    """`--threads` for the backends with their own thread pool, so the comparison is fair."""
    return {"onnxruntime": {"intra_op_num_threads": threads}} if threads else {}


def backend_candidate(name: str, options: Options | None = None) -> Candidate:
    """torch.compile with one registered backend, counting the graphs dynamo hands it."""
    label = "dynamo-eager" if name == "eager" else name
    if name not in backends.registry:  # not dynamo's namesake: its cudagraphs fakes wins on CPU
        return Candidate(label, "backend", None, "not_registered", not_registered(name))
    backend = backends.registry.lookup(name)
    reason = backend.available()
    if reason:
        return Candidate(label, "backend", None, "unavailable", reason)

    def make(model: nn.Module) -> Compiled:
        graphs: list[int] = []

        def counting(gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
            graphs.append(len(gm.graph.nodes))
            return backend(gm, example_inputs, **(options or {}).get(name, {}))

        return Compiled(torch.compile(model, backend=counting), lambda: len(graphs))

    return Candidate(label, "backend", make)


def chain_label(names: Sequence[str], mode: str) -> str:
    spelled = "" if tuple(names) == DEFAULT_CHAIN else f"({','.join(names)})"
    return f"chain{spelled}[{mode}]"


def losses(graphs: Sequence[GraphRecord]) -> list[str]:
    """Why the other backends lost, one line per distinct (backend, status, reason)."""
    lines = (str(a) for g in graphs for a in g.attempts if a.status not in KEPT_QUIET)
    return list(dict.fromkeys(lines))


def chain_candidate(names: Sequence[str], mode: str, options: Options | None = None) -> Candidate:
    """torch.compile with `chain(*names, mode=mode)`; winners come from the chain's report.

    Names not registered on this checkout are left out of the chain, and the row says so.
    """
    label = chain_label(names, mode)
    present = [n for n in names if n in backends.registry]
    missing = [n for n in names if n not in backends.registry]
    note = f"without {', '.join(missing)} (not registered)" if missing else ""
    if not present:
        return Candidate(label, "chain", None, "not_registered", note)
    opts = {k: v for k, v in (options or {}).items() if k in present}
    chain(*present, mode=mode, options=opts)  # a bad chain fails here, once, not per model

    def make(model: nn.Module) -> Compiled:
        backend = chain(*present, mode=mode, options=opts, memory=False)  # measured afresh
        return Compiled(
            torch.compile(model, backend=backend),
            lambda: len(backend.report.graphs),
            lambda: [str(g.winner or "none") for g in backend.report.graphs],
            lambda: losses(backend.report.graphs),
        )

    return Candidate(label, "chain", make, note=note)


def build_candidates(
    backend_list: Sequence[str],
    chains: Sequence[Sequence[str]],
    modes: Sequence[str] = MODES,
    options: Options | None = None,
) -> list[Candidate]:
    """Eager first (the baseline), then each backend, then each chain in each mode."""
    out = [baseline()] + [backend_candidate(n, options) for n in backend_list]
    return out + [chain_candidate(c, m, options) for c in chains for m in modes]
