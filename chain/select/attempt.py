"""Try one backend on one graph: compile (with retries), run, verify; compile and first run
under the chain's timeout."""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential
from torch import fx

from backends.errors import Transient, Unsupported, one_line
from backends.registry import Backend
from chain.judge.accuracy import relative_errors
from chain.judge.compiles import compiling, lineage
from chain.judge.fp64 import Later
from chain.judge.verify import Verdict, compare, compare_writes
from chain.report.records import Attempt, Status
from chain.select.isolation import (
    Fingerprint,
    Isolation,
    WeightWatch,
    compile_copy,
    fresh_copy,
)
from chain.select.worker import (
    CompileTimeout as CompileTimeout,  # re-exported: chain.select.attempt's
)
from chain.select.worker import RunTimeout, within

QUICK = "against eager within the recorded error bound"  # a remembered winner's check


class Mismatch(Exception):
    """Raised under strict=True when a candidate's outputs differ from eager's."""


def is_transient(exc: BaseException) -> bool:
    """Worth retrying as is: the backend said so, or the device ran out of memory."""
    return isinstance(exc, Transient | torch.OutOfMemoryError)


def _free_device_memory(_: Any) -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass(frozen=True)
class Reference:
    """Eager's outputs on this call's inputs, and how to feed inputs to a candidate.

    `runs` are the concrete inputs the chain runs the graph on (`chain.select.concrete`: dynamo's
    symbolic sizes replaced by their values; None when some size has none): the caller's
    own tensors, never handed to a run as they are. Each run gets fresh copies of the
    inputs `isolation` copies (every tensor but the weights the graph does not write);
    `after` holds eager's copies after its call and `wrote` the positions eager changed,
    for each candidate's effect on every input to be checked against; `watch` sees any
    change a run makes to the weights it shares (`chain.select.isolation`).
    """

    outputs: Any
    unverified: str | None  # why candidates are not compared with eager (None: they are)
    tolerances: dict[torch.dtype, tuple[float, float]] | None = None
    fp64: Any = None  # the graph's outputs in float64 (None: verified by tolerances)
    runs: tuple[Any, ...] | None = ()
    isolation: Isolation | None = None  # None: every tensor input copied, none watched
    after: dict[int, torch.Tensor] = field(default_factory=dict)
    # the copies' version counters before eager ran on them (a copy of an inference tensor
    # starts at 1, not 0): eager wrote the ones whose counter moved from there
    after_base: dict[int, int] = field(default_factory=dict)
    wrote: frozenset[int] = frozenset()
    watch: WeightWatch | None = None
    reductions: tuple[int, ...] = ()  # per output: how many values it reduces over
    # a remembered winner's check (chain.memory): eager's relative error per output as its
    # decision recorded it, and the float64 run kept for when the quick check is not enough
    recorded: tuple[float | None, ...] | None = None
    later: Later | None = None
    # the shared weights' fingerprints when `outputs` were recorded, kept for work verified
    # later: a weight changed since has them recorded again (chain.select.eager_run.current)
    weights: dict[int, Fingerprint] = field(default_factory=dict)

    @property
    def runnable(self) -> bool:
        """Whether the chain can run the graph itself (every symbolic size has a value)."""
        return self.runs is not None

    def copied(self) -> list[int]:
        """Positions of the inputs each run (and each compile) gets a fresh copy of."""
        if self.isolation is not None:
            return list(self.isolation.copied)
        return [i for i, x in enumerate(self.runs or ()) if isinstance(x, torch.Tensor)]

    def inputs(self) -> list[Any]:
        """The inputs for one run: fresh copies of all but the watched weights."""
        if self.runs is None:
            raise RuntimeError("the graph has symbolic sizes without values: it cannot be run")
        values = list(self.runs)
        for i in self.copied():
            values[i] = fresh_copy(values[i])
        return values

    def compile_inputs(self, example_inputs: Sequence[Any]) -> list[Any]:
        """What a backend compiles with: dynamo's inputs (symbolic sizes kept), with the
        same copies a run gets, so a compiler never holds the caller's own tensors."""
        values = list(example_inputs)
        for i in self.copied():
            if isinstance(values[i], torch.Tensor):
                values[i] = compile_copy(values[i])
        return values

    def name(self, i: int) -> str:
        """Input `i` as the report names it: `input 3 (l_x_)`."""
        names = self.isolation.names if self.isolation is not None else ()
        return f"input {i} ({names[i]})" if i < len(names) else f"input {i}"

    def verdict(self, outputs: Any, inputs: Sequence[Any]) -> Verdict:
        """A run's outputs and its effect on its copied `inputs` against eager's. With a
        recorded error and no float64 run yet, a quick comparison with eager first; the
        float64 rule judges whatever that does not clearly pass."""
        fp64, basis, verdict = self.fp64, None, None
        if fp64 is None and self.later is not None:
            quick = compare(
                self.outputs,
                outputs,
                self.tolerances,
                reductions=self.reductions,
                recorded=self.recorded,
            )
            if quick.reason is None:
                basis, verdict = QUICK, quick
            else:
                fp64, basis = self.later.get()[0], f"float64 (quick check: {quick.reason})"
        if verdict is None:
            verdict = compare(
                self.outputs, outputs, self.tolerances, fp64=fp64, reductions=self.reductions
            )
        if verdict.reason is None:
            verdict = self.writes_verdict(inputs) or verdict
        return dataclasses.replace(verdict, basis=basis)

    def resolved(self) -> tuple[Reference, str | None]:
        """This reference with its float64 run done (for a selection after a remembered
        winner failed), and the note when float64 could not run."""
        if self.later is None:
            return self, None
        fp64, note = self.later.get()
        return dataclasses.replace(self, fp64=fp64, later=None, recorded=None), note

    def errors(self) -> list[float | None] | None:
        """Eager's relative error against float64, per output (None: float64 did not run)."""
        return None if self.fp64 is None else relative_errors(self.fp64, self.outputs)

    def writes_verdict(self, inputs: Sequence[Any]) -> Verdict | None:
        """A candidate's effect on its copied inputs against eager's (`compare_writes`)."""
        if self.runs is None:
            return None
        names = {i: self.name(i) for i in self.after}
        return compare_writes(self.after, inputs, self.runs, self.wrote, names, self.tolerances)


def dynamo_signal(exc: BaseException) -> bool:
    """Dynamo's control flow (restart the analysis, skip the frame): not a backend's failure,
    so it passes through the chain untouched."""
    from torch._dynamo.exc import RestartAnalysis, SkipFrame

    return isinstance(exc, RestartAnalysis | SkipFrame)


def _compile(
    backend: Backend,
    gm: fx.GraphModule,
    inputs: list[Any],
    options: dict[str, Any],
    timeout_s: float | None,
) -> Callable[..., Any]:
    """Call the backend; with a timeout, in a thread abandoned if it hangs (chain.select.worker).
    The compile is marked in flight (`chain.judge.compiles.compiling`) until it ends, even
    abandoned: no timing runs beside it unflagged."""
    enclosing = lineage()

    def run() -> Callable[..., Any]:
        with compiling(backend.name, enclosing):
            return backend(gm, inputs, **options)

    return within(
        run,
        timeout_s,
        CompileTimeout,
        "in its compile",
        thread_name=f"compile-{backend.name}",
    )


def _first_run(
    name: str, fn: Callable[..., Any], inputs: list[Any], timeout_s: float | None
) -> Any:
    """The candidate's first call, on the chain's inputs, under the same timeout."""

    def run() -> Any:
        with torch.no_grad():
            return fn(*inputs)

    return within(run, timeout_s, RunTimeout, "in its first run", thread_name=f"run-{name}")


def failed_attempt(
    backend: str, status: Status, exc: BaseException, reason_prefix: str = "", **kw: Any
) -> Attempt:
    """An attempt that failed with `exc`: one-line reason, type and traceback kept."""
    reason = reason_prefix + (exc.reason if isinstance(exc, Unsupported) else one_line(exc))
    details = kw.pop("details", {})
    if isinstance(exc, Unsupported) and exc.detail:
        details = {**details, "detail": exc.detail}
    return Attempt(
        backend=backend,
        status=status,
        reason=reason,
        error_type=type(exc).__name__,
        traceback="".join(traceback.format_exception(exc)),
        details=details,
        **kw,
    )


def try_backend(
    backend: Backend,
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    reference: Reference,
    *,
    options: dict[str, Any],
    max_retries: int,
    timeout_s: float | None,
    strict: bool,
) -> tuple[Attempt, Callable[..., Any] | None]:
    """Compile, run and verify one candidate; a passing one comes back with status WON."""
    name = backend.name
    unavailable = backend.available()
    if unavailable:
        return Attempt(name, Status.UNAVAILABLE, unavailable), None

    retrying = Retrying(
        retry=retry_if_exception(is_transient),
        stop=stop_after_attempt(max_retries + 1),
        wait=wait_exponential(multiplier=0.05, max=1.0),
        before_sleep=_free_device_memory,
        reraise=True,
    )
    start = time.perf_counter()
    try:
        fn = retrying(
            _compile, backend, gm, reference.compile_inputs(example_inputs), options, timeout_s
        )
    except (Exception, SystemExit) as exc:  # SystemExit from a backend: its failure, not ours
        if dynamo_signal(exc):
            raise
        seconds = time.perf_counter() - start
        attempt = _compile_failed(name, exc, seconds, retrying, strict)
        return _with_weights(attempt, reference), None
    compile_s = time.perf_counter() - start
    retries = retrying.statistics.get("attempt_number", 1) - 1
    details = dict(getattr(fn, "chain_details", None) or {})
    if not callable(fn):
        exc = TypeError(f"backend returned {type(fn).__name__}, not a callable")
        if strict:
            raise exc
        attempt = failed_attempt(name, Status.COMPILE_ERROR, exc, compile_s=compile_s)
        return _with_weights(attempt, reference), None

    if not reference.runnable:  # no values for its sizes: the chain cannot run the graph
        return Attempt(
            name, Status.WON, reference.unverified or "", compile_s=compile_s, details=details
        ), fn
    try:
        outputs = _first_run(name, fn, inputs := reference.inputs(), timeout_s)
    except (Exception, SystemExit) as exc:
        if strict:
            raise
        attempt = failed_attempt(
            name, Status.RUNTIME_ERROR, exc, compile_s=compile_s, retries=retries, details=details
        )
        return _with_weights(attempt, reference), None

    kw: dict[str, Any] = {"compile_s": compile_s, "retries": retries, "details": details}
    if (weights := reference.watch.check(name) if reference.watch else None) is not None:
        if strict:
            raise Mismatch(f"{name}: {weights}")
        return Attempt(name, Status.MISMATCH, weights, error_type="Mismatch", **kw), None
    if reference.unverified:
        return Attempt(name, Status.WON, reference.unverified, **kw), fn
    verdict = reference.verdict(outputs, inputs)
    if verdict.reason is not None and strict:
        raise Mismatch(f"{name}: {verdict.reason}")
    passed = verdict.reason is None
    if verdict.basis is not None:
        kw["details"] = {**details, "verified": verdict.basis}
    return Attempt(
        name,
        Status.WON if passed else Status.MISMATCH,
        verdict.reason or "",
        error_type=None if passed else "Mismatch",
        max_abs_err=verdict.max_abs_err,
        **kw,
        **_errors(verdict),
    ), fn if passed else None


def _with_weights(attempt: Attempt, reference: Reference) -> Attempt:
    """A failed attempt, its reason extended when the run also changed a weight (which the
    watch restores, or raises WeightsDamaged for)."""
    weights = reference.watch.check(attempt.backend) if reference.watch else None
    if weights is None:
        return attempt
    return dataclasses.replace(attempt, reason=f"{attempt.reason}; also {weights}")


def _compile_failed(
    name: str, exc: BaseException, seconds: float, retrying: Retrying, strict: bool
) -> Attempt:
    """The attempt of a backend whose compile raised: unsupported, or a compile error."""
    if isinstance(exc, Unsupported):
        return failed_attempt(name, Status.UNSUPPORTED, exc, compile_s=seconds)
    if strict:
        raise exc
    retries = retrying.statistics.get("attempt_number", 1) - 1
    return failed_attempt(name, Status.COMPILE_ERROR, exc, compile_s=seconds, retries=retries)


def _errors(verdict: Verdict) -> dict[str, float | None]:
    """The attempt's error fields: its worst output's error against float64, and eager's."""
    worst = verdict.worst
    if worst is None:
        return {}
    return {"error": worst.error, "eager_error": worst.eager_error, "error_ratio": worst.ratio}


def why_not_raced(measure: bool, reference: Reference) -> str | None:
    """Why no race can run on this graph (None: one can)."""
    if not measure:
        return "measure=False"
    if reference.wrote:
        return "the graph writes its inputs"
    if reference.isolation is None or not reference.runnable:
        return "its inputs are not recorded"
    return None
