"""The ONNX exporter kept quiet on the threads that export: its logs below ERROR and its
warnings go to the attempt's record (`details["warnings"]`), nothing process-wide is
touched (no stream redirects, no `warnings.catch_warnings`, no logger levels), and
`CHAIN_VERBOSE=1` (or `TORCH_LOGS`) lets everything through as usual."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

_NOISY_LOGGERS = ("torch.onnx", "torch.export", "torch._export", "onnxscript", "onnx_ir")


class _QuietThreads(logging.Filter):
    """Drops the exporter's records below ERROR when they come from a thread inside
    `quiet()`; other threads' records pass as the user configured them."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or not quiet_here()


_QUIET = _QuietThreads()
_quiet_local = threading.local()
# torch's pytree deprecation, raised inside torch.export (attributed to copyreg): filtered once
# here, by message, because per-call warnings.catch_warnings is process-wide and not
# thread-safe (a worker's exit restores filters other threads changed meanwhile)
warnings.filterwarnings(
    "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning
)


def quiet_here() -> bool:
    return getattr(_quiet_local, "depth", 0) > 0


VERBOSE_ENV = "CHAIN_VERBOSE"  # set (not "0"): the exporter's logs and warnings show as usual


def verbose() -> bool:
    """Whether the user asked to see third-party output: CHAIN_VERBOSE, or TORCH_LOGS set
    (torch's own switch for its logs); then `quiet()` neither filters nor captures."""
    flag = os.environ.get(VERBOSE_ENV, "").strip().lower()
    return flag not in ("", "0", "false", "no", "off") or bool(os.environ.get("TORCH_LOGS"))


def filter_noisy_loggers() -> None:
    """Attach the quiet filter to the exporter's loggers that exist now (they are created
    as its modules are imported; a filter acts only on the logger a record starts at)."""
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if (
            isinstance(logger, logging.Logger)
            and name.startswith(_NOISY_LOGGERS)
            and _QUIET not in logger.filters
        ):
            logger.addFilter(_QUIET)


_shown_before: list[Callable[..., None]] = []  # the `warnings.showwarning` that `_show` wraps
_HOOK_LOCK = threading.Lock()
MAX_WARNINGS = 20  # per export: the first ones, each one line


def _show(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    """`warnings.showwarning` for every thread: a warning raised on a thread inside `quiet()`
    (numpy's RuntimeWarnings from ONNX's reference evaluator folding constants) goes to that
    thread's list; any other is shown as before."""
    captured = getattr(_quiet_local, "captured", None)
    if captured is None or not quiet_here():
        _shown_before[-1](message, category, filename, lineno, file, line)
        return
    if len(captured) < MAX_WARNINGS:
        where = f"{os.path.basename(filename)}:{lineno}"
        captured.append(f"{category.__name__}: {str(message).strip()} ({where})")


def _hook_warnings() -> None:
    """Put `_show` in front of whatever shows warnings now (once; again after a
    `warnings.catch_warnings` block restored the one it found): the hook decides per
    thread, so no thread's warnings state changes, unlike a catch_warnings of its own."""
    with _HOOK_LOCK:
        if warnings.showwarning is not _show:
            _shown_before.append(warnings.showwarning)
            del _shown_before[:-1]
            warnings.showwarning = _show


@contextlib.contextmanager
def quiet(into: list[str] | None = None) -> Iterator[list[str]]:
    """Silence the exporter's logs below ERROR on this thread (and the export thread it
    starts), and collect the warnings raised on it into the list it yields (`into`, or the
    enclosing quiet()'s, or a new one), touching no process-wide state but the one
    `warnings.showwarning` hook that decides per thread: no stream redirects, no warnings
    filters, no logger levels. The exporter prints nothing with verbose=False and
    report=False. With CHAIN_VERBOSE or TORCH_LOGS set, it does nothing (`verbose`)."""
    if verbose():
        yield [] if into is None else into
        return
    filter_noisy_loggers()
    _hook_warnings()
    outer = getattr(_quiet_local, "captured", None)
    captured = into if into is not None else outer if outer is not None else []
    _quiet_local.captured = captured
    _quiet_local.depth = getattr(_quiet_local, "depth", 0) + 1
    try:
        yield captured
    finally:
        _quiet_local.depth -= 1
        _quiet_local.captured = outer


def captured_here() -> list[str] | None:
    """The list this thread's quiet() collects warnings into (None: not inside one)."""
    return getattr(_quiet_local, "captured", None)
