"""`torch.compiler.is_exporting()` true only on the thread that exports.

torch.export keeps "exporting" in one process-wide flag. While the chain exports a graph on
a worker thread, every other thread sees it too: dynamo's wrapper around each compiled
graph (`torch._dynamo.disable`) then edits FX's process-wide node metadata
(`fx.traceback.annotate`), which the export thread replaces meanwhile, and the user's call
raises `KeyError: 'custom'`; model code that asks `is_exporting()` takes its export branch.

`exporting_here()` marks the calling thread as the one that exports (with `cancel`'s
process-wide section: one export at a time). While a thread holds it, `is_exporting()`
answers for that thread alone; with none held it is torch's answer, unchanged. Installed
when this module is imported, as `torch.compiler.is_exporting` (dynamo reads it from
there at each call), before any graph is traced: dynamo folds it to a constant like
torch's (`assume_constant_result`), so every process traces the same graphs whether or
not it exported (a late install made a decision's key differ between processes).
`from torch.compiler import is_exporting` made earlier keeps torch's.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

_owner: int | None = None  # the thread inside exporting_here(), if any
_torch_is_exporting = torch.compiler.is_exporting


@torch._dynamo.assume_constant_result
def is_exporting() -> bool:
    """torch's flag, except on a thread other than the one the chain exports on."""
    owner = _owner
    if owner is not None and owner != threading.get_ident():
        return False
    return _torch_is_exporting()


torch.compiler.is_exporting = is_exporting


@contextlib.contextmanager
def exporting_here() -> Iterator[None]:
    """Run an export on this thread with other threads seeing `is_exporting()` False. The
    caller holds `cancel.process_wide()` (one export at a time); re-entry is allowed."""
    global _owner
    previous, _owner = _owner, threading.get_ident()
    try:
        yield
    finally:
        _owner = previous
