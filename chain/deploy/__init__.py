"""Export: an ExportedProgram whose compiled parts carry their engines or ONNX models.

`chain.export(model, args)` returns an `ExportResult` (`program, report = ...`);
`torch.export.save` saves the program; `chain.load(path)` loads it with checks (a whole
file, no pickles, payloads bound to their nodes); plain `torch.export.load` works too in
any process that imports `chain` (which registers the `backend_chain::run_payload` op).
Input and output classes this process has not imported load as `StandIn`s (same fields,
one `StandInWarning`). `chain.load(path).module()` is a `LeanModule`: the graph behind our
own input check (`InputMismatch`), ~50 us a call less than torch's `module()`; a program
that is one CPU payload call runs its session directly for plain inputs (`direct.py`).
A backend takes part through its export hooks (`backends.common.parts`); this package
knows none by name.
"""

from backends.common.payload import (
    Header,
    PayloadError,
    PayloadMismatch,
    RuntimeMissing,
    pack,
    unpack,
)
from backends.common.payload import TensorSpec as OutputSpec
from chain.deploy.capture import CaptureError
from chain.deploy.exporter import ExportError, ExportResult, export
from chain.deploy.inputs import InputMismatch
from chain.deploy.loader import load
from chain.deploy.ops import cache_info, clear_cache, run_payload
from chain.deploy.program import LeanModule, LoadedProgram
from chain.deploy.structure import StandIn, StandInWarning

__all__ = [
    "CaptureError",
    "ExportError",
    "ExportResult",
    "Header",
    "InputMismatch",
    "LeanModule",
    "LoadedProgram",
    "OutputSpec",
    "PayloadError",
    "PayloadMismatch",
    "RuntimeMissing",
    "StandIn",
    "StandInWarning",
    "cache_info",
    "clear_cache",
    "export",
    "load",
    "pack",
    "run_payload",
    "unpack",
]
