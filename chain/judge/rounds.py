"""The timing loop: eager and the candidates in randomly ordered rounds of short blocks until
every candidate is decided against eager or the budget is spent (chain.judge.timing holds
the verdicts and the evidence it reads)."""

from __future__ import annotations

import dataclasses
import functools
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from backends import cancel
from backends.errors import BackendExit
from chain.judge.compiles import compiles_running, lineage
from chain.judge.evidence import Machine, load_average, running_threads
from chain.judge.timing import (
    MIN_ROUNDS,
    UNDECIDED,
    Deadline,
    Progress,
    Timing,
    TimingError,
    Z,
    compare,
    evidence_of,
    implausible,
    timings_of,
)


@dataclass(frozen=True)
class Plan:
    """How long and how finely to time: the budget, warm-up calls, block length, rounds."""

    budget_s: float = 0.2
    warmup: int = 2
    block_s: float = 1e-3
    min_rounds: int = MIN_ROUNDS
    max_rounds: int = 400
    seed: int = 0
    z: float = Z


def _call(
    name: str,
    fn: Callable[..., Any],
    inputs: Sequence[Any],
    watch: Progress | None = None,
    baseline: str | None = None,
) -> None:
    cancel.checkpoint()  # abandoned (a deadline, the process leaving): stop calling
    if watch is not None:  # under a deadline per call: say which call is in flight, since when
        watch.start(name, bounded=name != baseline)  # eager's calls: the floor, no deadline
    try:
        fn(*inputs)
    except Exception as exc:
        raise TimingError(name, exc) from exc
    except SystemExit as exc:  # the candidate's failure, not the end of the process
        raise TimingError(name, BackendExit(exc)) from exc


def _sync_for(inputs: Sequence[Any]) -> Callable[[], None]:
    devices = {x.device for x in inputs if isinstance(x, torch.Tensor) and x.is_cuda}
    if not devices:
        return lambda: None

    def sync() -> None:
        for device in devices:
            torch.cuda.synchronize(device)

    return sync


def measure(
    fns: Mapping[str, Callable[..., Any]],
    inputs: Sequence[Any],
    *,
    baseline: str,
    budget_s: float = 0.2,
    warmup: int = 2,
    block_s: float = 1e-3,
    min_rounds: int = MIN_ROUNDS,
    max_rounds: int = 400,
    seed: int = 0,
    z: float = Z,
    stall_s: float | None = None,
    deadline: Deadline | None = None,
) -> dict[str, Timing]:
    """Time every fn (baseline included) in randomly ordered rounds of short blocks, until
    every one is decided against the baseline or `budget_s` is spent; an implausible figure
    is timed once more. Every Timing carries the run's evidence.

    `stall_s`: the longest any one call may take (compile_timeout_s); `deadline` then runs
    the timing under it (in a worker thread: chain.select.worker.timing_deadline), and a call
    that overruns it is a TimingError of its fn.
    The baseline's calls (eager, the floor) have no deadline: abandoning them leaves no
    fallback, and the reference already ran the graph to its end.
    """
    if baseline not in fns:
        raise ValueError(f"baseline {baseline!r} is not among {sorted(fns)}")
    plan = Plan(budget_s, warmup, block_s, min_rounds, max_rounds, seed, z)
    run = functools.partial(_measured, fns, inputs, baseline, plan, lineage())
    if stall_s is None:
        return run()
    if deadline is None:
        raise ValueError("stall_s needs a deadline: the runner of calls under it")
    watch = Progress()
    try:
        return deadline(run, stall_s, watch)
    except TimeoutError as exc:  # the deadline's abandonment (chain.select.worker)
        raise TimingError(watch.name, exc) from None


def _measured(
    fns: Mapping[str, Callable[..., Any]],
    inputs: Sequence[Any],
    baseline: str,
    plan: Plan,
    mine: tuple[int, ...],
    watch: Progress | None = None,
) -> dict[str, Timing]:
    """`measure` on this thread: the rounds, a re-timing if a figure is implausible, the
    evidence; `mine`: the compiles the caller runs inside (not noise)."""
    loads = [load_average()]
    compiles = compiles_running(mine)
    start = time.perf_counter()
    runnable: list[int] = []  # threads runnable machine-wide, once a round
    with torch.no_grad():
        calls = _calibrated(fns, inputs, baseline, plan, watch)
        samples = _rounds(fns, inputs, baseline, plan, calls, watch, runnable)
        timings = timings_of(samples, baseline, plan.z)
        device = "cuda" if any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs) else "cpu"
        retimed = 0
        if implausible(timings, device):
            retimed = 1
            again = dataclasses.replace(plan, seed=plan.seed + 1)
            runnable.clear()
            samples = _rounds(fns, inputs, baseline, again, calls, watch, runnable)
            timings = timings_of(samples, baseline, plan.z)
    seconds = time.perf_counter() - start
    loads.append(load_average())
    compiles += compiles_running(mine)
    machine = Machine(loads, runnable, compiles)
    evidence = evidence_of(samples[baseline], timings, device, machine, retimed, seconds)
    return {name: dataclasses.replace(t, evidence=evidence) for name, t in timings.items()}


def _calibrated(
    fns: Mapping[str, Callable[..., Any]],
    inputs: Sequence[Any],
    baseline: str,
    plan: Plan,
    watch: Progress | None,
) -> dict[str, int]:
    """Warm every fn up; how many calls fill one block of each."""
    sync = _sync_for(inputs)
    calls: dict[str, int] = {}
    for name, fn in fns.items():
        for _ in range(plan.warmup):
            _call(name, fn, inputs, watch, baseline)
        sync()
        start = time.perf_counter()
        _call(name, fn, inputs, watch, baseline)
        sync()
        once = time.perf_counter() - start
        calls[name] = max(1, min(1000, math.ceil(plan.block_s / max(once, 1e-7))))
    return calls


def _rounds(
    fns: Mapping[str, Callable[..., Any]],
    inputs: Sequence[Any],
    baseline: str,
    plan: Plan,
    calls: Mapping[str, int],
    watch: Progress | None,
    runnable: list[int],
) -> dict[str, list[float]]:
    """Rounds in a fresh random order until every fn is decided or the budget is spent;
    the threads runnable machine-wide after each round go on `runnable` (where known)."""
    sync = _sync_for(inputs)
    order = list(fns)
    rng = random.Random(plan.seed)
    samples: dict[str, list[float]] = {name: [] for name in fns}
    deadline = time.perf_counter() + plan.budget_s
    for rounds in range(1, plan.max_rounds + 1):
        rng.shuffle(order)
        for name in order:
            fn = fns[name]
            _call(name, fn, inputs, watch, baseline)  # lead-in: pays for the switch
            sync()
            start = time.perf_counter()
            for _ in range(calls[name]):
                _call(name, fn, inputs, watch, baseline)
            sync()
            samples[name].append((time.perf_counter() - start) / calls[name])
        if (now := running_threads()) is not None:
            runnable.append(now)
        if rounds >= plan.min_rounds and (
            time.perf_counter() > deadline or decided(samples, baseline, plan.z)
        ):
            break
    return samples


def decided(samples: Mapping[str, Sequence[float]], baseline: str, z: float = Z) -> bool:
    """Every candidate is faster, slower or tied against the baseline."""
    return all(
        compare(samples[baseline], values, z).verdict != UNDECIDED
        for name, values in samples.items()
        if name != baseline
    )
