"""The threads that call the chain's graphs, process-wide: work that traces a graph at run
time (a challenger's export or compile at a graph's second call, a hot shape's bucket, the
next backend after a winner fails, a confirmed decision's package) is done only while one
thread alone has called them.

Why: tracing (make_fx under inductor's compile, ONNX Runtime's exporter and its
decompositions) patches `nn.Module.__call__` and sets torch.fx's tracing flag process-wide
while it runs. Another thread's call of a compiled model meanwhile raises ("Detected that
you are using FX to symbolically trace a dynamo-optimized function", "Guard failed on the
same frame it was created", `KeyError: 'custom'`). Measured (a compiled MLP called in a
loop on one thread while the other traced): beside make_fx 699,990 of 700,015 calls raised,
beside ONNX Runtime's export 14 of 532. Inside dynamo's compile the compiling flag is up and
other threads' calls pass (0 of 10,574 raised beside inductor's compile), hence `may_trace`.

The guard notes each call's thread (one comparison when it is the first caller's). A
second thread, once seen, is remembered for the process: threads of a pool take turns, and
a quiet moment says nothing of the next request.
"""

from __future__ import annotations

import sys

from backends.common import tracing

MAX_KEPT = 64  # threads named in the note, at most


class Callers:
    """The first thread to call a graph of the chain, and the others seen since."""

    __slots__ = ("first", "others")

    def __init__(self) -> None:
        self.first: int | None = None
        self.others: set[int] = set()

    def another(self, ident: int) -> None:
        """A call from a thread that is not the first's (or the very first call)."""
        if self.first is None:
            self.first = ident
        elif ident != self.first and len(self.others) < MAX_KEPT:
            self.others.add(ident)

    def alone(self) -> bool:
        """True while every call so far came from one thread."""
        return not self.others

    def why_not(self) -> str:
        """Why run-time tracing is not done now (for a graph's note)."""
        n = len(self.others) + 1
        more = "+" if len(self.others) >= MAX_KEPT else ""
        return (
            f"{n}{more} threads call this process's compiled graphs, and tracing at run time "
            "changes nn.Module.__call__ and torch.fx's tracing flag process-wide: their calls "
            "of compiled models meanwhile would raise (chain.run.callers)"
        )


CALLERS = Callers()


def may_trace() -> bool:
    """True where a trace cannot disturb other threads' calls: one thread alone has called,
    or this thread is inside dynamo's compile (it holds dynamo's compile lock, so no other
    thread compiles, and dynamo's compiling flag is up: other threads' calls of compiled
    models pass meanwhile, as beside torch's own compiles; measured, none raised)."""
    return CALLERS.alone() or _compiling_here()


tracing.set_rule(may_trace)  # the backends' own run-time traces follow the same rule


def _compiling_here() -> bool:
    """Whether this thread holds dynamo's compile lock (torch._dynamo.convert_frame's, a
    private name; False where torch has none). Not `torch.compiler.is_compiling()`: that
    flag is process-wide, true on every thread while any one compiles."""
    lock = getattr(sys.modules.get("torch._dynamo.convert_frame"), "compile_lock", None)
    owned = getattr(lock, "_is_owned", None)
    return bool(owned is not None and owned())


def reset() -> None:
    """Forget the threads seen (a test's fresh start; a process that knows its threads
    are done)."""
    CALLERS.first = None
    CALLERS.others = set()
