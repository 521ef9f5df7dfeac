"""Latency of several callables on the same inputs, without bias by position.

Measured on CPU: whatever is timed right after an ONNX Runtime call runs ~25 us slower, so
single calls interleaved in a fixed order made eager read 0.62x or 1.55x of itself. Here
each round runs the candidates in a fresh random order, each in a block: one untimed
lead-in call (it absorbs the switch from another runtime), then back-to-back timed calls
filling ~`block_s`, CUDA-synchronized. A round gives one sample per candidate, and one
paired ratio baseline/candidate (drift during the round hits both alike). Rounds go on
until every candidate is decided against the baseline (the 99% confidence interval of its
ratio excludes 1, or lies within 1% of it: a tie) or the budget is spent.

"Measurably slower" needs both: the whole interval below 1 and the median ratio below
0.99 (the 2022 TorchDynamo autotuner's margin), so a tie is never called a loss.
"""

from __future__ import annotations

import functools
import math
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from backends import cancel
from backends.errors import BackendExit
from chain.worker import Progress, RunTimeout, within

Z = 2.576  # 99% two-sided: a tie is called a loss (or a win) in well under 1% of graphs
TIE = 0.01  # ratios within 1% of 1 are a tie whatever the interval says


class TimingError(Exception):
    """A candidate raised while being timed; `name` says which."""

    def __init__(self, name: str, exc: Exception) -> None:
        super().__init__(f"{name} raised while being timed: {exc}")
        self.name = name
        self.exc = exc


@dataclass(frozen=True)
class Timing:
    """One candidate's latency: median per call, the spread of that median, and the
    speedup over the baseline with its 99% confidence interval (paired by round)."""

    median_ms: float
    spread_ms: float  # half-width of the 99% confidence interval of the median
    samples: int  # timed blocks
    speedup: float  # baseline median / this median
    speedup_lo: float
    speedup_hi: float

    @property
    def slower(self) -> bool:
        """Measurably slower than the baseline: the whole interval below 1, by over 1%."""
        return self.speedup_hi < 1.0 and self.speedup < 1.0 - TIE

    @property
    def faster(self) -> bool:
        """Measurably faster than the baseline: the whole interval above 1, by over 1%."""
        return self.speedup_lo > 1.0 and self.speedup > 1.0 / (1.0 - TIE)

    def describe(self) -> str:
        return (
            f"{self.median_ms:.3f} ± {self.spread_ms:.3f} ms, {self.speedup:.2f}x "
            f"(99% CI {self.speedup_lo:.2f}-{self.speedup_hi:.2f}x)"
        )


def median_ci(values: Sequence[float], z: float = Z) -> tuple[float, float]:
    """Distribution-free confidence interval of the median (order statistics, binomial)."""
    ordered = sorted(values)
    n = len(ordered)
    half = z * math.sqrt(n) / 2
    lo = max(0, round(n / 2 - half) - 1)
    hi = min(n - 1, round(1 + n / 2 + half) - 1)
    return ordered[lo], ordered[hi]


def _call(
    name: str,
    fn: Callable[..., Any],
    inputs: Sequence[Any],
    watch: Progress | None = None,
    baseline: str | None = None,
) -> None:
    if watch is not None:  # under a deadline per call: say which call is in flight, since when
        cancel.checkpoint()  # abandoned: stop rather than keep calling every candidate
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
    min_rounds: int = 5,
    max_rounds: int = 400,
    seed: int = 0,
    z: float = Z,
    stall_s: float | None = None,
) -> dict[str, Timing]:
    """Time every fn (baseline included) in randomly ordered rounds of short blocks.

    `stall_s`: the longest any one call may take (compile_timeout_s); the timing then runs
    in a worker thread (chain.worker) and a call that overruns it is a TimingError of its fn.
    The baseline's calls (eager, the floor) have no deadline: abandoning them leaves no
    fallback, and the reference already ran the graph to its end.
    """
    if baseline not in fns:
        raise ValueError(f"baseline {baseline!r} is not among {sorted(fns)}")
    run = functools.partial(
        _measure, fns, inputs, baseline, budget_s, warmup, block_s, min_rounds, max_rounds, seed, z
    )
    if stall_s is None:
        return run()
    watch = Progress()
    try:
        return within(
            lambda: run(watch),
            stall_s,
            RunTimeout,
            "in one call while timed",
            thread_name="timing",
            progress=watch,
        )
    except RunTimeout as exc:
        raise TimingError(watch.name, exc) from None


def _measure(
    fns: Mapping[str, Callable[..., Any]],
    inputs: Sequence[Any],
    baseline: str,
    budget_s: float,
    warmup: int,
    block_s: float,
    min_rounds: int,
    max_rounds: int,
    seed: int,
    z: float,
    watch: Progress | None = None,
) -> dict[str, Timing]:
    """`measure`'s rounds, on this thread; `watch` follows the call in flight."""
    sync = _sync_for(inputs)
    order = list(fns)
    rng = random.Random(seed)
    with torch.no_grad():
        calls: dict[str, int] = {}
        for name, fn in fns.items():
            for _ in range(warmup):
                _call(name, fn, inputs, watch, baseline)
            sync()
            start = time.perf_counter()
            _call(name, fn, inputs, watch, baseline)
            sync()
            once = time.perf_counter() - start
            calls[name] = max(1, min(1000, math.ceil(block_s / max(once, 1e-7))))
        samples: dict[str, list[float]] = {name: [] for name in fns}
        deadline = time.perf_counter() + budget_s
        for rounds in range(1, max_rounds + 1):
            rng.shuffle(order)
            for name in order:
                fn = fns[name]
                _call(
                    name, fn, inputs, watch, baseline
                )  # lead-in: pays for the switch from another runtime
                sync()
                start = time.perf_counter()
                for _ in range(calls[name]):
                    _call(name, fn, inputs, watch, baseline)
                sync()
                samples[name].append((time.perf_counter() - start) / calls[name])
            if rounds >= min_rounds and (
                time.perf_counter() > deadline or _decided(samples, baseline, z)
            ):
                break
    return _timings(samples, baseline, z)


def _ratios(samples: Mapping[str, list[float]], baseline: str, name: str) -> list[float]:
    return [b / s for b, s in zip(samples[baseline], samples[name], strict=True)]


def _decided(samples: Mapping[str, list[float]], baseline: str, z: float) -> bool:
    """Every candidate is apart from the baseline, or tied with it within 1%."""
    for name in samples:
        if name != baseline:
            lo, hi = median_ci(_ratios(samples, baseline, name), z)
            apart = hi < 1.0 or lo > 1.0
            tied = lo >= 1.0 - TIE and hi <= 1.0 / (1.0 - TIE)
            if not (apart or tied):
                return False
    return True


def _timings(samples: Mapping[str, list[float]], baseline: str, z: float) -> dict[str, Timing]:
    base = statistics.median(samples[baseline])
    out = {}
    for name, values in samples.items():
        median = statistics.median(values)
        lo, hi = median_ci(values, z)
        if name == baseline:
            s_lo = s_hi = 1.0
        else:
            s_lo, s_hi = median_ci(_ratios(samples, baseline, name), z)
        out[name] = Timing(
            median_ms=1000 * median,
            spread_ms=1000 * (hi - lo) / 2,
            samples=len(values),
            speedup=base / median,
            speedup_lo=s_lo,
            speedup_hi=s_hi,
        )
    return out
