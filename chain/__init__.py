"""backend-chain: a torch.compile backend that tries compilers per graph and reports why.

from chain import chain, export, load

backend = chain("tensorrt", "cudagraphs", "onnxruntime", "eager")
fast = torch.compile(model, backend=backend)
fast(x)
print(backend.report)

`from chain import chain` gives the factory, which also carries the module's public names
(`chain.export`, `chain.load`, `chain.Report`, ...): `chain.export(...)` works whichever
`chain` (the module or the factory) a script holds.
"""

from __future__ import annotations

import backends as _backends  # noqa: F401  (registers the built-in backends)
from chain.deploy import CaptureError, ExportError, ExportResult, export, load
from chain.dynamo import DEFAULT_CHAIN, chain_for, default_backends, last_chain, report_for
from chain.report.records import Attempt, GraphRecord, Status
from chain.report.report import Report, ReportError
from chain.run.watch.updates import weights_changed
from chain.select.attempt import CompileTimeout, Mismatch
from chain.select.core import AllCandidatesFailed, Chain
from chain.select.isolation import WeightsDamaged


def chain(*backends: object, **kwargs: object) -> Chain:
    """A chain of backends (names, callables, other chains), tried per graph in order.

    Keyword options (each checked here: a bad one is an `InvalidOption`):

    - `mode`: "first" (the first backend that passes wins) or "fastest" (all are timed)
    - `verify`, `measure`, `strict`, `eager_floor`: True or False
    - `options`: {backend name: {option: value}}, checked by each backend
    - `report_path`: a JSON file rewritten after every graph (default `$CHAIN_REPORT`)
    - `min_speedup`, `compile_timeout_s`, `max_retries`, `measure_budget_s`
    - `tolerances`: {dtype: (rtol, atol)} without a float64 reference
    - `cuda_graphs`: "auto", True or False
    - `watch`, `reverify_rate`: the run-time checks and the share of time re-verifying
    - `memory`, `store`, `max_artefact_mb`: remembered decisions and their store
    - `bucket_after`, `max_buckets`, `max_bucket_mb`: per-shape buckets
    - `challengers`: backends compiled in the background and raced against the winner
      at run time ("auto": inductor where installed)
    - `regions`: with mode "fastest", also serve a graph by regions under different
      backends, kept only when measurably faster than the whole-graph winner (off by default)

    Each is described in [Options](guide/options.md#chain-options).
    """
    return Chain(*backends, **kwargs)  # type: ignore[arg-type]


__all__ = [
    "DEFAULT_CHAIN",
    "AllCandidatesFailed",
    "Attempt",
    "CaptureError",
    "Chain",
    "CompileTimeout",
    "ExportError",
    "ExportResult",
    "GraphRecord",
    "Mismatch",
    "Report",
    "ReportError",
    "Status",
    "WeightsDamaged",
    "chain",
    "chain_for",
    "default_backends",
    "export",
    "last_chain",
    "load",
    "report_for",
    "weights_changed",
]


def _carry_public_names() -> None:
    """Give the factory the module's public names as attributes: after `from chain import
    chain`, `chain.export(...)` still means the module's `export`, not an AttributeError."""
    namespace = globals()
    for name in __all__:
        setattr(chain, name, namespace[name])


_carry_public_names()
