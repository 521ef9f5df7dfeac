"""Outcomes as data: the status vocabulary, the timing evidence and one attempt of one backend."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Any

from chain.report import json_fields as jf


class Status(str, Enum):
    """What happened to one backend on one graph; one vocabulary for report, CLI and tests.

    In a finished record, exactly one attempt (the winner) is WON. While the chain works on
    a graph, WON also marks a candidate that passed verification and is still in the running:
    the speed rules (eager floor, min_speedup, `fastest`) turn the losers into SLOWER before
    the record is stored, so no report shows more than one.
    """

    WON = "won"  # the winner; during selection: passed, not yet beaten
    UNAVAILABLE = "unavailable"  # cannot run on this machine (package, device)
    UNSUPPORTED = "unsupported"  # the backend declined this graph, with a reason
    COMPILE_ERROR = "compile_error"  # it raised (or timed out) while compiling
    RUNTIME_ERROR = "runtime_error"  # it compiled, then raised when run
    MISMATCH = "mismatch"  # its outputs differ from eager's
    SLOWER = "slower"  # it passed but lost on speed
    NOT_TRIED = "not_tried"  # a winner came earlier in the chain

    def __str__(self) -> str:
        return self.value


FAILURES = frozenset(
    {
        Status.UNAVAILABLE,
        Status.UNSUPPORTED,
        Status.COMPILE_ERROR,
        Status.RUNTIME_ERROR,
        Status.MISMATCH,
    }
)


_NUMBERS = (
    "compile_s",
    "latency_ms",
    "speedup",
    "max_abs_err",
    "error",
    "eager_error",
    "error_ratio",
    "spread_ms",
    "speedup_lo",
    "speedup_hi",
)


def number(value: Any, what: str) -> float | None:
    """`value` as read from JSON if it is a number or null ("NaN", "Infinity" and
    "-Infinity" as the writer spells them, `json_fields.standard`); TypeError naming `what`
    if not."""
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        return value
    if isinstance(value, str) and value in jf.NON_FINITE:
        return jf.NON_FINITE[value]
    raise TypeError(f"{what} should be a number or null, got {jf.short(value)}")


# a timed attempt's verdict against eager (chain.judge.timing); REFERENCE: eager itself, 1.0x
FASTER, SLOWER, TIED, UNDECIDED, REFERENCE = "faster", "slower", "tie", "undecided", "reference"


@dataclass(frozen=True)
class TimingEvidence:
    """How one timing run went (chain.judge.timing): enough to judge its figures. `noisy` says
    why they may not hold (empty: they do); a noisy decision is never remembered."""

    rounds: int  # timed rounds (a re-timing's only, when there was one)
    seconds: float  # spent in rounds, re-timing included
    eager_spread: float | None = None  # eager's own rounds: interquartile range / median
    load: float | None = None  # the 1-minute load average per CPU, the highest seen
    cpus: int | None = None
    # other threads runnable machine-wide while timed, per CPU (median over rounds; Linux)
    busy: float | None = None
    retimed: int = 0  # re-timings of an implausible figure
    noisy: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "noisy": list(self.noisy)}

    @classmethod
    def from_dict(cls, data: Any, what: str = "timing") -> TimingEvidence | None:
        """The evidence `to_dict` wrote (None when absent); TypeError naming a wrong field."""
        if data is None:
            return None
        data = jf.mapping(data, what)
        return cls(
            rounds=jf.integer(data.get("rounds", 0), f"{what}: rounds"),
            seconds=number(data.get("seconds"), f"{what}: seconds") or 0.0,
            eager_spread=number(data.get("eager_spread"), f"{what}: eager_spread"),
            load=number(data.get("load"), f"{what}: load"),
            cpus=jf.optional_integer(data.get("cpus"), f"{what}: cpus"),
            busy=number(data.get("busy"), f"{what}: busy"),
            retimed=jf.integer(data.get("retimed", 0), f"{what}: retimed"),
            noisy=jf.texts(data.get("noisy", []), f"{what}: noisy"),
        )

    def merged(self, other: TimingEvidence) -> TimingEvidence:
        """Two runs of one graph as one: rounds and seconds added, the worst of the rest."""
        worst = [x for x in (self.eager_spread, other.eager_spread) if x is not None]
        loads = [x for x in (self.load, other.load) if x is not None]
        busy = [x for x in (self.busy, other.busy) if x is not None]
        return TimingEvidence(
            rounds=self.rounds + other.rounds,
            seconds=self.seconds + other.seconds,
            eager_spread=max(worst) if worst else None,
            load=max(loads) if loads else None,
            cpus=self.cpus or other.cpus,
            busy=max(busy) if busy else None,
            retimed=self.retimed + other.retimed,
            noisy=tuple(dict.fromkeys((*self.noisy, *other.noisy))),
        )

    def __str__(self) -> str:
        parts = [f"{self.rounds} rounds in {self.seconds:.2f} s"]
        if self.eager_spread is not None:
            parts.append(f"eager's spread {self.eager_spread:.0%}")
        if self.load is not None:
            parts.append(f"load {self.load:.2f} per CPU")
        if self.busy is not None:
            parts.append(f"{self.busy:.2f} other runnable per CPU")
        if self.retimed:
            parts.append(f"re-timed {self.retimed}x")
        text = ", ".join(parts)
        return f"noisy: {'; '.join(self.noisy)} ({text})" if self.noisy else text


@dataclass(frozen=True)
class Attempt:
    """One backend tried on one graph: its status, why, and what it cost and gained."""

    backend: str
    status: Status
    reason: str = ""
    error_type: str | None = None
    traceback: str | None = None
    compile_s: float | None = None
    latency_ms: float | None = None
    speedup: float | None = None
    max_abs_err: float | None = None  # largest |candidate - eager| over floating outputs
    # RMSE against the graph run in float64 (the output that used most of its allowance),
    # eager's on that output, and their ratio: None without a float64 reference
    error: float | None = None
    eager_error: float | None = None
    error_ratio: float | None = None
    spread_ms: float | None = None  # half-width of the 99% confidence interval of latency_ms
    retries: int = 0
    details: dict[str, Any] = field(default_factory=dict)
    cuda_graphs: bool = False  # this attempt is a backend's variant run under CUDA graphs
    # the speedup's 99% confidence interval (paired by round) and the verdict it gives
    # against eager (chain.judge.timing: faster, slower, tie, undecided, or reference: eager
    # itself), and the run it was timed in; None when not timed
    speedup_lo: float | None = None
    speedup_hi: float | None = None
    verdict: str | None = None
    evidence: TimingEvidence | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["status"] = self.status.value
        out["evidence"] = self.evidence.to_dict() if self.evidence is not None else None
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Attempt:
        """The attempt `to_dict` wrote; a field of the wrong type is a TypeError naming it."""
        data = jf.mapping(data, "an attempt")
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        who = f"attempt {jf.text(data['backend'], 'an attempt: backend')!r}"
        kwargs["status"] = Status(jf.text(data["status"], f"{who}: status"))
        for name in _NUMBERS:
            kwargs[name] = number(kwargs.get(name), f"{who}: {name}")
        kwargs["reason"] = jf.text(kwargs.get("reason", ""), f"{who}: reason")
        for name in ("error_type", "traceback"):
            kwargs[name] = jf.optional_text(kwargs.get(name), f"{who}: {name}")
        kwargs["retries"] = jf.integer(kwargs.get("retries", 0), f"{who}: retries")
        kwargs["details"] = jf.mapping(kwargs.get("details", {}), f"{who}: details")
        kwargs["cuda_graphs"] = jf.flag(kwargs.get("cuda_graphs", False), f"{who}: cuda_graphs")
        kwargs["verdict"] = jf.optional_text(kwargs.get("verdict"), f"{who}: verdict")
        kwargs["evidence"] = TimingEvidence.from_dict(kwargs.get("evidence"), f"{who}: evidence")
        return cls(**kwargs)

    def __str__(self) -> str:
        text = f"{self.backend}: {self.status.value}"
        if self.speedup is not None and self.status in (Status.WON, Status.SLOWER):
            text += f" ({self.speedup:.2f}x)"
        return f"{text}: {self.reason}" if self.reason else text


def merged_evidence(attempts: Sequence[Attempt]) -> TimingEvidence | None:
    """The evidence of the timing runs behind `attempts` (each run once), as one."""
    runs = list(dict.fromkeys(a.evidence for a in attempts if a.evidence is not None))
    if not runs:
        return None
    out = runs[0]
    for run in runs[1:]:
        out = out.merged(run)
    return out
