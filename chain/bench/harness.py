"""Timing: compile each candidate, check it against eager, then time all of them interleaved.

Every repeat runs each live candidate once (a round-robin whose start rotates), so drift
of the machine (frequency, other load) hits all columns alike; the figure is the median.
Speedup is the eager median over the candidate's median, from the same repeats.
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from backends.errors import Unsupported, one_line
from chain.judge.fp64 import fp64_inputs
from chain.judge.verify import compare

Inputs = tuple[torch.Tensor, ...]


@dataclass
class Compiled:
    """A ready-to-call candidate and a way to ask it, after the first call, what it made."""

    fn: Callable[..., Any]
    graphs: Callable[[], int | None] = lambda: None
    winners: Callable[[], list[str]] = list
    lost: Callable[[], list[str]] = list  # why the others lost, for chains


@dataclass
class Candidate:
    """One column of the benchmark: a label and a factory, or the reason it cannot run here."""

    label: str
    kind: str  # "eager" (the baseline), "backend" or "chain"
    make: Callable[[nn.Module], Compiled] | None
    status: str = "ok"  # "unavailable" or "not_registered" when make is None
    reason: str = ""
    note: str = ""


@dataclass
class Result:
    """One row: a model run by a candidate, with its figures or the reason it has none."""

    model: str
    candidate: str
    kind: str
    status: str
    reason: str = ""
    median_ms: float | None = None
    iqr_ms: float | None = None  # spread of the timed samples: p75 - p25
    speedup: float | None = None
    compile_s: float | None = None
    max_abs_err: float | None = None
    graphs: int | None = None
    winners: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    samples: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Settings:
    """How to time: warm-up rounds, timed repeats, and the shortest a timed sample may be."""

    repeats: int = 20
    warmup: int = 3
    min_sample_ms: float = 1.0  # calls per sample grow until a sample lasts this long


def failure(error: BaseException) -> tuple[str, str]:
    """(status, reason) for a failure: dynamo's wrapper peeled off, the first line kept."""
    inner: BaseException = error
    while getattr(inner, "inner_exception", None) is not None or inner.__cause__ is not None:
        inner = getattr(inner, "inner_exception", None) or inner.__cause__  # type: ignore[assignment]
    if isinstance(inner, Unsupported):
        return "unsupported", inner.reason
    return "compile_error", one_line(inner, limit=300)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn: Callable[..., Any], inputs: Inputs, calls: int, device: torch.device) -> float:
    """Milliseconds per call over `calls` back-to-back calls, device work included."""
    _sync(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn(*inputs)
    _sync(device)
    return (time.perf_counter() - start) * 1e3 / calls


def _device(inputs: Inputs) -> torch.device:
    return inputs[0].device if inputs else torch.device("cpu")


def _drop(result: Result, live: dict[str, Compiled], label: str, error: BaseException) -> None:
    """A candidate that failed after compiling: its row says why, its column stops."""
    result.status, result.reason = "runtime_error", failure(error)[1]
    live.pop(label, None)


def fp64_outputs(model: nn.Module, inputs: Inputs) -> Any:
    """The model's outputs in float64 (a copy), the reference the chain verifies against;
    None when the model cannot run so (then outputs are compared under dtype tolerances)."""
    try:
        return copy.deepcopy(model).double()(*fp64_inputs(inputs))
    except Exception as error:  # no float64 kernel, out of memory: say so, compare by tolerances
        print(f"no float64 reference ({failure(error)[1]}): compared under dtype tolerances")
        return None


def warm_dynamo() -> None:
    """Compile a trivial function once, so dynamo's first-use costs (imports, caches) are
    not charged to whichever candidate happens to compile first."""
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(1))
    torch._dynamo.reset()


def compile_candidates(
    model_name: str,
    model: nn.Module,
    inputs: Inputs,
    candidates: Sequence[Candidate],
    expected: Any,
    step: Callable[[str], None] = lambda _: None,
    fp64: Any = None,
) -> tuple[dict[str, Result], dict[str, Compiled]]:
    """Build every runnable candidate and time its first call (the compile time); check its
    outputs as the chain does (against float64 when `fp64` holds the model's float64 ones)."""
    results: dict[str, Result] = {}
    live: dict[str, Compiled] = {}
    device = _device(inputs)
    for cand in candidates:
        step(f"{model_name}: compiling {cand.label}")
        result = Result(model_name, cand.label, cand.kind, cand.status, cand.reason or cand.note)
        results[cand.label] = result
        if cand.make is None:
            continue
        try:
            compiled = cand.make(copy.deepcopy(model))
            _sync(device)
            start = time.perf_counter()
            out = compiled.fn(*inputs)
            _sync(device)
            result.compile_s = time.perf_counter() - start
        except Exception as error:  # a failed candidate is a row with its reason, not a crash
            result.status, result.reason = failure(error)
            continue
        verdict = compare(expected, out, fp64=fp64)
        result.max_abs_err = verdict.max_abs_err
        if verdict.reason:  # still timed: a wrong answer's speed is worth knowing, not winning
            result.status, result.reason = "mismatch", verdict.reason
        result.graphs, result.winners = compiled.graphs(), compiled.winners()
        result.lost = compiled.lost()
        live[cand.label] = compiled
    return results, live


def bench_model(
    model_name: str,
    model: nn.Module,
    inputs: Inputs,
    candidates: Sequence[Candidate],
    settings: Settings,
    step: Callable[[str], None] = lambda _: None,
) -> list[Result]:
    """All candidates on one model: compile, verify, warm up and time them interleaved."""
    if not candidates or candidates[0].kind != "eager":
        raise ValueError("the first candidate must be the eager baseline")
    device = _device(inputs)
    with torch.no_grad():
        expected = model(*inputs)
        fp64 = fp64_outputs(model, inputs)
        results, live = compile_candidates(
            model_name, model, inputs, candidates, expected, step, fp64
        )
        step(f"{model_name}: warming up")
        for _ in range(settings.warmup):
            for label, compiled in list(live.items()):
                try:
                    compiled.fn(*inputs)
                except Exception as error:  # fails after compiling: recorded, dropped
                    _drop(results[label], live, label, error)
        baseline = live.get(candidates[0].label)
        once = (
            statistics.median(_time(baseline.fn, inputs, 1, device) for _ in range(3))
            if baseline
            else settings.min_sample_ms
        )
        calls = max(1, min(1000, math.ceil(settings.min_sample_ms / max(once, 1e-6))))
        samples: dict[str, list[float]] = {label: [] for label in live}
        labels = list(live)
        for rep in range(settings.repeats if labels else 0):
            step(f"{model_name}: timing ({rep + 1}/{settings.repeats})")
            for label in labels[rep % len(labels) :] + labels[: rep % len(labels)]:
                if label not in live:
                    continue
                try:
                    samples[label].append(_time(live[label].fn, inputs, calls, device))
                except Exception as error:  # fails mid-run: recorded, dropped
                    _drop(results[label], live, label, error)
    base = candidates[0].label
    eager_ms = statistics.median(samples[base]) if base in live else None
    for label, times in samples.items():
        res = results[label]
        if label not in live:
            continue
        res.median_ms, res.samples = statistics.median(times), len(times) * calls
        quartiles = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
        res.iqr_ms = quartiles[2] - quartiles[0]
        res.speedup = eager_ms / res.median_ms if eager_ms and res.median_ms > 0 else None
    return list(results.values())
