"""One stage of a candidate (compile, first run, timing) under `compile_timeout_s`.

The stage runs in a daemon thread that carries what the caller's thread holds and a
compiler or runner reads (grad and inference mode, dynamo's tracing and compile contexts,
the current CUDA stream). Without a result in time it is abandoned: its token is cancelled
(`backends.cancel`: it stops at its next checkpoint), the caller waits for any
process-wide torch tracing in flight to end, and the thread's eventual result is discarded
(logged at debug level). A call in progress, in C++ or Python, cannot be killed: it runs on.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import _guards
from torch._guards import CompileContext, TracingContext, compile_context
from torch._guards import tracing as tracing_context

from backends import cancel
from chain.judge.timing import Progress

T = TypeVar("T")
log = logging.getLogger("chain")

SETTLE_S = 60.0  # the longest wait for an abandoned worker's process-wide tracing to end


class Abandoned(TimeoutError):
    """A stage gave no result within its deadline; its thread runs on, its result discarded.

    `settle_s`: how long the caller then waited for the thread's process-wide torch
    tracing (torch.export) to end before going on.
    """

    def __init__(self, message: str, settle_s: float = 0.0) -> None:
        super().__init__(message)
        self.settle_s = settle_s


class CompileTimeout(Abandoned):
    """The backend did not return within the chain's compile timeout."""


class RunTimeout(Abandoned):
    """A compiled candidate's call did not return within the chain's compile timeout."""


@dataclass(frozen=True)
class ThreadState:
    """The caller's thread-local torch state that a stage on another thread must keep."""

    grad: bool
    inference: bool
    tracing: TracingContext | None
    compiling: CompileContext | None
    stream: Any  # torch.cuda.Stream | None

    @classmethod
    def capture(cls) -> ThreadState:
        stream = None
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            stream = torch.cuda.current_stream()
        return cls(
            torch.is_grad_enabled(),
            torch.is_inference_mode_enabled(),
            TracingContext.try_get(),
            CompileContext.try_get(),
            stream,
        )

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        with (
            torch.inference_mode(self.inference),
            torch.set_grad_enabled(self.grad),
            compile_context(self.compiling),
            _borrowed(self.tracing),
            torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext(),
        ):
            yield


@contextlib.contextmanager
def _borrowed(context: TracingContext | None) -> Iterator[None]:
    """The caller's TracingContext on this thread, given back on exit without torch's
    `tracing()` exit: that cleans up the context's ShapeEnv, which the caller's compile owns
    and still uses (an abandoned worker ends whenever it ends)."""
    if not hasattr(_guards, "_TLS"):  # torch moved it: its own context manager then
        with tracing_context(context):
            yield
        return
    previous = TracingContext.try_get()
    _guards._TLS.tracing_context = context
    try:
        yield
    finally:
        _guards._TLS.tracing_context = previous


def within(
    fn: Callable[[], T],
    timeout_s: float | None,
    error: type[Abandoned],
    where: str,
    *,
    thread_name: str = "chain-stage",
    progress: Progress | None = None,
) -> T:
    """`fn()`, or `error` when it gives no result within `timeout_s` (None: no deadline,
    called on this thread). With `progress`, the deadline counts from the start of the
    call in flight. KeyboardInterrupt while waiting abandons the worker and propagates."""
    if timeout_s is None:
        return fn()
    future: concurrent.futures.Future[T] = concurrent.futures.Future()
    state, token = ThreadState.capture(), cancel.Token()

    def work() -> None:
        try:
            with cancel.holding(token), state.applied():
                future.set_result(fn())
        except BaseException as exc:  # handed to the caller (or logged once abandoned)
            future.set_exception(exc)

    # a daemon thread: a hung stage must not keep the process alive at exit
    threading.Thread(target=work, name=thread_name, daemon=True).start()
    start = time.perf_counter()
    try:
        while True:
            since = progress.since if progress is not None else start
            left = since + timeout_s - time.perf_counter()
            if progress is not None and not progress.bounded:
                left = timeout_s  # look again then: the next call may have a deadline
            done, _ = concurrent.futures.wait([future], timeout=max(left, 0.0))
            if done:
                return future.result()
            if progress is not None and not progress.bounded:
                continue  # a call without deadline in flight: wait for it (or the next)
            if progress is None or progress.since == since:
                break  # no result, and no call returned meanwhile
    except BaseException:  # KeyboardInterrupt: stop the worker's next steps, then propagate
        _abandon(token, future, thread_name, "the caller was interrupted")
        raise
    message = f"no result after {timeout_s:g}s {where} (compile_timeout_s); abandoned"
    settle_s = _abandon(token, future, thread_name, message)
    if settle_s >= 0.05:
        message += f" (then waited {settle_s:.1f}s for its torch.export trace to end)"
    raise error(message, settle_s)


def _abandon(
    token: cancel.Token, future: concurrent.futures.Future[Any], name: str, why: str
) -> float:
    """Cancel the worker, wait for its process-wide tracing in flight; seconds waited."""
    token.cancel(why)
    start = time.perf_counter()
    if not cancel.settle(SETTLE_S):
        log.warning(
            "%s: abandoned, but its process-wide torch tracing is still in flight after %gs; "
            "going on (models called meanwhile may fail)",
            name,
            SETTLE_S,
        )
    future.add_done_callback(lambda f: _discarded(name, f))
    return time.perf_counter() - start


def _discarded(name: str, future: concurrent.futures.Future[Any]) -> None:
    """An abandoned worker ended: its result is dropped, and said so."""
    exc = future.exception()
    outcome = "returned" if exc is None else f"raised {type(exc).__name__}: {exc}"
    log.debug("%s (abandoned) finally %s; discarded", name, outcome)


def timing_deadline(run: Callable[[Progress], T], stall_s: float, progress: Progress) -> T:
    """`run(progress)` on a worker thread, each call it starts under `stall_s`
    (chain.judge.rounds.measure's deadline); RunTimeout when one overruns it."""
    return within(
        lambda: run(progress),
        stall_s,
        RunTimeout,
        "in one call while timed",
        thread_name="timing",
        progress=progress,
    )
