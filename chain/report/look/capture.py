"""What a repro needs, taken when a graph compiles: its code, and where its backends live."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable

from torch import fx

from backends.errors import one_line
from backends.registry import Backend

log = logging.getLogger("chain")


def graph_code(gm: fx.GraphModule) -> str | None:
    """The graph module as a standalone `class Repro(torch.nn.Module)` (dynamo's minifier
    writer); None when it cannot be written, said on the `chain` logger at INFO: the repro
    tool names the missing code when asked, so a run is not noisy for it."""
    from torch._dynamo.debug_utils import NNModuleToString

    try:
        return NNModuleToString.convert(gm)
    except Exception as e:  # an internal writer: a failure costs the repro, not the run
        # one line: the writer's message can hold the whole module's text
        log.info("graph code not kept for repros: %s", one_line(e))
        return None


BUILT_IN = ("backends", "torch", "chain")  # a fresh process has these by name


def sources(backends: Iterable[Backend]) -> dict[str, str]:
    """`module:qualified.name` of each backend that a fresh process knows only once the
    user's module is imported (a plain callable, or one registered there), when that can
    be imported (not a lambda nor a local function); a script's function as
    `/abs/path/script.py:name`."""
    found = {}
    for backend in backends:
        compiler = backend.compiler
        target = compiler if hasattr(compiler, "__qualname__") else type(compiler)
        module = getattr(target, "__module__", None)
        qualname = getattr(target, "__qualname__", "")
        if module is None or module.split(".")[0] in BUILT_IN:
            continue
        if not qualname or "<" in qualname:
            continue
        if module == "__main__":  # the user's script: recorded by its file, for a repro
            module = _script_file()
            if module is None:
                continue
        found[backend.name] = f"{module}:{qualname}"
    return found


def _script_file() -> str | None:
    """The absolute path of the script run as `python script.py` (None: an interactive
    session, `-c`, a notebook: nothing a fresh process can load)."""
    file = getattr(sys.modules.get("__main__"), "__file__", None)
    if not isinstance(file, str) or not file.endswith(".py"):
        return None
    return os.path.abspath(file)
