"""Challengers compiled after the first call: in mode "first", once a graph's winner
serves, the candidates after it and the chain's `challengers` (by default inductor where it
is installed and not in the chain; on CUDA also its CUDA graphs variant) are prepared at
the graph's second call, verified, then join the graph's run-time race
(chain.select.racing). The first call pays only for the first candidate that passes.

A challenger whose backend can build its artefact apart (`prepare`: inductor's AOTInductor
package) is compiled in a child process: at the second call only its export runs on the
calling thread (a small BERT's second call: 0.49 s, against 14.9 s for inductor's compile
there: benchmarks/challenger_child.py); the background worker (chain.select.background,
after the process settled) runs the child, loads the artefact with the backend's `reuse`,
verifies it and races it. A child that fails, dies or hangs costs only its challenge (its
note says so; at exit it is abandoned like a package build). Where `prepare` declines
(packages off, a CUDA graph), the challenger compiles on the calling thread at the second
call, as any other.

Why not compile on a background thread: compiling traces the graph with torch.fx, which
patches `nn.Module.__call__` and sets a tracing flag process-wide while it runs; a serving
thread calling the compiled model meanwhile raises ("Detected that you are using FX to
symbolically trace a dynamo-optimized function"; seen on the first try, then the process
ended in `std::terminate`). On the calling thread, between its own calls, nothing of this
model runs beside it while one thread serves; once a second thread has called, nothing is
prepared (chain.run.callers: the export traces too). Loading and running a built package
traces nothing.

A challenger is verified by the chain's rule (`try_backend`) on the graph's recorded
inputs, against its reference (float64 where selection ran it), marked as a compile (a
timing run beside it records it as noise). Every outcome is a note on the graph's record.
Graphs with symbolic sizes are not challenged (the compile sees one set of concrete sizes).
CHAIN_CHALLENGERS=none turns the default off (the test suite does; tests that race name
their challengers).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import fx

from backends import cancel
from backends.errors import Unsupported, one_line
from backends.registry import Artefact, Backend, lookup_backend, offered_artefact
from chain.judge.compiles import compiling
from chain.report.records import Status
from chain.run.callers import CALLERS, may_trace
from chain.run.graphs import base_name
from chain.select import background
from chain.select.attempt import Reference, try_backend
from chain.select.deferred import load_verified, snapshot
from chain.select.eager_run import current

if TYPE_CHECKING:
    from chain.run.guard import GuardedGraph
    from chain.select.records import Records

log = logging.getLogger("chain")
ENV = "CHAIN_CHALLENGERS"  # "none": no default challengers (named ones still race)
AUTO = "auto"
# untimed runs of a verified challenger before it races: its one-off first-run costs (a
# CUDA graph tree records at its second run, triton autotunes its kernels at their first)
# are its compile's, not the race's. Unpaid, on an H200 they took the race's whole 2% budget:
# GPT-2 served 12,000 calls, its challengers met 11 pairs, none promoted
WARM_RUNS = 3


def default_challengers(chain_names: list[str]) -> list[Backend]:
    """`challengers="auto"`: inductor where it is installed and not in the chain."""
    if os.environ.get(ENV, "").strip().lower() in ("none", "0", "off"):
        return []
    if "inductor" in chain_names:
        return []
    inductor = lookup_backend("inductor")
    return [inductor] if not inductor.available() else []


@dataclass(frozen=True)
class Challenge:
    """Compile and verify `backends` for graph `record_id`, then race each that passes."""

    records: Records
    options: dict[str, dict[str, Any]]  # the chain's per-backend options
    timeout_s: float | None  # the chain's compile_timeout_s
    record_id: int
    backends: tuple[Backend, ...]
    gm: fx.GraphModule
    inputs: list[Any]
    reference: Reference
    guard: GuardedGraph
    # races it (with the artefact it was built from, if any); the note
    join: Callable[[GuardedGraph, str, Callable[..., Any], Artefact | None], str]
    grad: bool
    inference: bool


def challenge(
    stage: tuple[Records, dict[str, dict[str, Any]], float | None],
    record_id: int,
    gm: fx.GraphModule,
    inputs: list[Any],
    reference: Reference,
    guard: GuardedGraph,
    backends: list[Backend],
    join: Callable[[GuardedGraph, str, Callable[..., Any], Artefact | None], str],
) -> str | None:
    """Queue the graph's challengers; the note saying why none are (None: none to try)."""
    if not backends:
        return None
    symbolic = any(
        isinstance(x, torch.SymInt)
        or (isinstance(x, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in x.shape))
        for x in inputs
    )
    if symbolic or not reference.runnable:
        why = "symbolic sizes" if symbolic else "its inputs are not recorded"
        return f"challengers not compiled ({why}): {', '.join(b.name for b in backends)}"
    job = Challenge(
        *stage, record_id, tuple(backends), gm, list(reference.runs or ()), snapshot(reference),
        guard, join, torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
    )  # fmt: skip
    # the guard's first call is still the user's first call (dynamo runs the graph it was
    # just handed): it arms the second, which compiles the challengers, once
    guard.later = lambda: setattr(guard, "later", lambda: run(job))
    return None


def run(job: Challenge) -> None:
    """Prepare each challenger in turn (on the calling thread): queued to be built in a
    child where its backend can, else compiled, verified and raced here; every outcome is
    the graph's note. Not beside other threads' calls: both trace the graph."""
    if not may_trace():
        names = ", ".join(b.name for b in job.backends)
        background.noted(job.records, job.record_id,
                         f"challengers not prepared ({names}): {CALLERS.why_not()}")  # fmt: skip
        return
    for backend in job.backends:
        try:
            note, declined = _apart(job, backend)
            if note is None:
                note = _run(job, backend, declined)
        except Exception as error:  # every failure is the graph's note, never lost
            log.warning("graph %d: challenger %s failed", job.record_id, backend.name,
                        exc_info=True)  # fmt: skip
            note = f"challenger {backend.name} failed: {one_line(error)}"
        background.noted(job.records, job.record_id, note)


def _apart(job: Challenge, backend: Backend) -> tuple[str | None, str]:
    """Queue `backend`'s build in a child (its `prepare` hook, the export here); the note,
    or None and why not (it has no such hook, or declined this graph)."""
    if backend.prepare is None:
        return None, ""
    name = base_name(backend.name)  # a CUDA graphs variant loads its backend's artefact
    base = backend if name == backend.name else lookup_backend(name)
    if base.reuse is None:
        return None, ""
    start = time.perf_counter()
    try:
        with (
            compiling(f"{backend.name} (challenger export)"),
            torch.inference_mode(job.inference),
            torch.set_grad_enabled(job.grad),
        ):
            build = backend.prepare(job.gm, job.inputs, **job.options.get(name, {}))
    except Unsupported as why:
        return None, f" (not built in a child process: {why.reason})"
    took = time.perf_counter() - start
    background.submit(Apart(job, base, backend.name, build, took))
    return (
        f"challenger {backend.name} exported at call 2 in {took:.1f} s; built in a child "
        "process once the process settles, then verified and raced"
    ), ""


@dataclass(frozen=True)
class Apart:
    """A challenger built in a child process (a `background.Job`): its artefact loaded by
    `backend`'s `reuse`, verified, then raced."""

    job: Challenge
    backend: Backend  # the registered backend whose `reuse` loads the artefact
    name: str  # the challenger's name (the backend, or its CUDA graphs variant)
    build: Callable[[], Artefact]
    exported_s: float  # the part that ran on the calling thread

    @property
    def records(self) -> Records:
        return self.job.records

    @property
    def record_id(self) -> int:
        return self.job.record_id

    @property
    def what(self) -> str:
        return f"challenger {self.name}'s build in a child process"

    def failed(self, why: str) -> str:
        return f"challenger {self.name}: its build in a child process failed ({why})"

    def run(self) -> str:
        """Build, load, verify; race it if it passes. The graph's note on the outcome."""
        job, name = self.job, self.name
        start = time.perf_counter()
        with (
            compiling(f"{name} (challenger, in a child process)"),
            torch.inference_mode(job.inference),
            torch.set_grad_enabled(job.grad),
        ):
            artefact = self.build()
            cancel.checkpoint()  # the process may be leaving: no torch work here then
            reference, again = current(job.gm, job.reference)
            loaded = load_verified(
                self.backend, name, artefact.data, job.gm, job.inputs, reference,
                job.options.get(self.backend.name, {}),
            )  # fmt: skip
            if loaded is None:
                return f"challenger {name}: its artefact cannot be loaded ({self.backend.name})"
            attempt, fn = loaded
            warm = _warmed(fn, reference) if attempt.status is Status.WON else ""
        took = time.perf_counter() - start
        where = (
            f"built in a child process in {took:.1f} s (exported at call 2 in "
            f"{self.exported_s:.1f} s{'; ' + again if again else ''})"
        )
        if fn is None or attempt.status is not Status.WON:
            return f"challenger {name} {where}: {attempt.status}: {attempt.reason}"
        joined = job.join(job.guard, name, fn, artefact)
        return f"challenger {name} {where} and verified{warm}; {joined}"


def _run(job: Challenge, backend: Backend, declined: str = "") -> str:
    """Compile and verify one challenger here; race it if it passes. The note on the
    outcome (`declined`: why it was not built in a child)."""
    name = backend.name
    start = time.perf_counter()
    with (
        compiling(f"{name} (challenger)"),
        torch.inference_mode(job.inference),
        torch.set_grad_enabled(job.grad),
    ):
        reference, again = current(job.gm, job.reference)
        declined += f" ({again})" if again else ""
        attempt, fn = try_backend(
            backend,
            job.gm,
            job.inputs,
            reference,
            options=job.options.get(base_name(name), {}),
            max_retries=0,
            timeout_s=job.timeout_s,
            strict=False,
        )
        warm = _warmed(fn, reference) if attempt.status is Status.WON else ""
    took = time.perf_counter() - start
    if fn is None or attempt.status is not Status.WON:
        return f"challenger {name}{declined}: {attempt.status}: {attempt.reason}"
    joined = job.join(job.guard, name, fn, offered_artefact(fn))
    return (
        f"challenger {name} compiled and verified at call 2 in {took:.1f} s{declined}{warm}; "
        f"{joined}"
    )


def _warmed(fn: Callable[..., Any] | None, reference: Reference) -> str:
    """Run a verified challenger `WARM_RUNS` times, untimed, on the recorded inputs (fresh
    copies of the activations); what it took, for its note."""
    if fn is None:
        return ""
    start = time.perf_counter()
    for _ in range(WARM_RUNS):
        cancel.checkpoint()
        fn(*reference.inputs())
    if any(isinstance(x, torch.Tensor) and x.is_cuda for x in reference.runs or ()):
        torch.cuda.synchronize()
    return f", warmed up by {WARM_RUNS} runs in {time.perf_counter() - start:.2f} s"
