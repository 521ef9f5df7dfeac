"""Candidates timed against eager in one run (chain.judge.timing, under the chain's compile
timeout per call: chain.select.worker), then checked again: the weights as they were, each
candidate verified once more after its many calls, and none handing out the memory of an
answer it gave before."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

from chain.judge.compiles import lineage, quiet
from chain.judge.rounds import measure
from chain.judge.speed import EAGER_REF, UNDECIDED_MORE, Fns, SpeedRules, is_reference, timed
from chain.judge.timing import Timing, TimingError
from chain.report.records import Attempt, Status
from chain.select.attempt import Mismatch, Reference, failed_attempt
from chain.select.worker import timing_deadline


def time_candidates(
    rules: SpeedRules, attempts: list[Attempt], fns: Fns, gm: fx.GraphModule, reference: Reference
) -> tuple[list[Attempt], dict[str, Timing]]:
    """Time eager and `fns` in one run; fill in latency, spread, speedup, its interval,
    the verdict and the run's evidence.

    A candidate that raises while timed becomes a runtime_error and leaves `fns`. The
    eager backend (by name: what its callable is varies, a lazy graph module's stub
    with inductor in the chain) and any candidate that returned `gm.forward` itself are
    the reference: they take its timing, 1.0x by construction, never a second one.
    """
    same = [k for k, f in fns.items() if is_reference(k, f, gm)]
    if len(same) < len(fns):  # candidates to compare: other compiles end first
        quiet(rules.quiet_s, lineage())  # (what still runs then is on the evidence)
    while True:
        try:
            timings = measure(
                {EAGER_REF: gm.forward, **{k: f for k, f in fns.items() if k not in same}},
                reference.inputs(),
                baseline=EAGER_REF,
                budget_s=rules.budget_s * (1 + UNDECIDED_MORE),
                stall_s=rules.stall_s,
                deadline=timing_deadline,
            )
            break
        except TimingError as err:
            if err.name not in fns or rules.strict:
                raise err.exc from None
            del fns[err.name]
            attempts = [
                failed_attempt(
                    a.backend,
                    Status.RUNTIME_ERROR,
                    err.exc,
                    reason_prefix="while timed: ",
                    compile_s=a.compile_s,
                    details=a.details,
                )
                if a.backend == err.name
                else a
                for a in attempts
            ]
    timings.update({k: timings[EAGER_REF] for k in same})
    attempts = _weights_after_timing(attempts, fns, reference)
    attempts = _verified_after_timing(attempts, fns, reference, rules.strict, same)
    return [timed(a, timings[a.backend]) if a.backend in fns else a for a in attempts], timings


def _weights_after_timing(attempts: list[Attempt], fns: Fns, reference: Reference) -> list[Attempt]:
    """The weights after the timed calls, as after each candidate's first run
    (`chain.select.isolation`): a change (undone where a snapshot was kept, else
    WeightsDamaged) makes the candidates timed together a `mismatch`; they leave `fns`. One
    candidate is timed at a time in `first` mode, so the reason names the one that did it."""
    timed = [a.backend for a in attempts if a.backend in fns]
    if reference.watch is None or not timed:
        return attempts
    reason = reference.watch.check(", ".join(timed))
    if reason is None:
        return attempts
    if len(timed) > 1:
        reason += f" (timed together: {', '.join(timed)})"
    for name in timed:
        del fns[name]
    return [
        dataclasses.replace(
            a, status=Status.MISMATCH, reason=f"while timed: {reason}", error_type="Mismatch"
        )
        if a.backend in timed
        else a
        for a in attempts
    ]


def _verified_after_timing(
    attempts: list[Attempt], fns: Fns, reference: Reference, strict: bool, same: list[str]
) -> list[Attempt]:
    """Each timed candidate verified once more, after its many timed calls: one that goes
    wrong after its first run (stale buffers, a cache, a fault) is a `mismatch` (or a
    `runtime_error`) and leaves `fns`, rather than win on the first run's verdict."""
    if reference.unverified or not reference.runnable:
        return attempts
    failed: dict[str, Attempt] = {}
    for a in attempts:
        if a.backend not in fns or a.backend in same:  # `same`: eager's own forward
            continue
        inputs = reference.inputs()
        try:
            with torch.no_grad():
                outputs = fns[a.backend](*inputs)
        except (Exception, SystemExit) as exc:  # SystemExit: the backend's failure
            if strict:
                raise
            failed[a.backend] = failed_attempt(
                a.backend,
                Status.RUNTIME_ERROR,
                exc,
                reason_prefix="after timing: ",
                compile_s=a.compile_s,
                details=a.details,
            )
            continue
        verdict = reference.verdict(outputs, inputs)
        if verdict.reason is None:  # right again: and in memory of its own this time?
            verdict = dataclasses.replace(
                verdict, reason=_reused(fns[a.backend], outputs, reference)
            )
        if verdict.reason is not None:
            if strict:
                raise Mismatch(f"{a.backend}: after timing: {verdict.reason}")
            failed[a.backend] = dataclasses.replace(
                a,
                status=Status.MISMATCH,
                reason=f"after timing: {verdict.reason}",
                error_type="Mismatch",
            )
    for name in failed:
        del fns[name]
    return [failed.get(a.backend, a) for a in attempts]


def _reused(fn: Any, first: Any, reference: Reference) -> str | None:
    """Why `fn` hands out memory it returned before: called again while the caller still
    holds `first` (its last outputs), an output of the new call is memory of one of those
    (a static output buffer: every answer the caller keeps would be overwritten). Outputs
    in the inputs' memory or the graph's own constants are as eager returns them."""
    held = [t for t in pytree.tree_leaves(first) if isinstance(t, torch.Tensor) and t.numel()]
    inputs = reference.inputs()
    own = {x.untyped_storage().data_ptr() for x in inputs if isinstance(x, torch.Tensor)}
    eager = pytree.tree_leaves(reference.outputs)  # a constant eager returns as it is
    own |= {x.untyped_storage().data_ptr() for x in eager if isinstance(x, torch.Tensor)}
    ptrs = {
        t.data_ptr(): i for i, t in enumerate(held) if t.untyped_storage().data_ptr() not in own
    }
    if not ptrs:
        return None
    with torch.no_grad():
        again = fn(*inputs)
    for j, t in enumerate(pytree.tree_leaves(again)):
        if isinstance(t, torch.Tensor) and t.numel() and t.data_ptr() in ptrs:
            return (
                f"output {j} is the memory of output {ptrs[t.data_ptr()]} of its "
                "previous call, which the caller still held: every answer it gives is overwritten "
                "by the next"
            )
    return None
