"""What the run-time checks did on one graph: counts and the failure, kept on its record."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class WeightUpdate:
    """The user changed the weights between calls: seen before call `call`; `backend`, the
    winner then, refreshed them (`how`, in `refresh_s`) or reads them live."""

    call: int
    backend: str
    weights: int  # how many parameters and buffers changed
    how: str
    refresh_s: float = 0.0

    @classmethod
    def from_dict(cls, data: Any) -> WeightUpdate:
        if not isinstance(data, dict):
            raise TypeError(f"an update should be an object, got {type(data).__name__}")
        return cls(
            call=int(data.get("call", 0)),
            backend=str(data.get("backend", "")),
            weights=int(data.get("weights", 0)),
            how=str(data.get("how", "")),
            refresh_s=float(data.get("refresh_s", 0.0)),
        )

    def __str__(self) -> str:
        took = f" in {self.refresh_s * 1e3:.1f} ms" if self.refresh_s else ""
        text = f"call {self.call}: {self.weights} weight(s) updated, {self.backend} {self.how}"
        return text + took


@dataclass
class RunChecks:
    """Mutable counters the guard updates as the graph runs (one per graph, shared by the
    winners it has had). Under concurrent calls `calls` is the latest call number seen."""

    reverify_rate: float = 0.0
    calls: int = 0  # calls of a watched winner, each given the cheap checks
    reverified: int = 0  # calls also re-run in eager and compared
    float64: int = 0  # of those, the ones eager alone could not pass: float64 ran too
    scanned: float = 1.0  # share of calls whose CPU outputs are scanned for NaN/inf
    reverify_s: float = 0.0  # re-verifying's cost: eager's and float64's runs, comparisons,
    # and what it slowed the winner's calls around it by (chain.run.watch.schedule)
    failures: list[str] = field(default_factory=list)  # "backend at call N: reason"
    unchecked: list[str] = field(default_factory=list)  # what the cheap checks leave out
    updates: list[WeightUpdate] = field(default_factory=list)  # the user's, between calls

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> RunChecks | None:
        """The counters `to_dict` wrote (None when absent); TypeError on a wrong type."""
        if data is None:
            return None
        if not isinstance(data, dict):
            raise TypeError(f"watch should be an object or null, got {type(data).__name__}")
        return cls(
            reverify_rate=float(data.get("reverify_rate", 0.0)),
            calls=int(data.get("calls", 0)),
            reverified=int(data.get("reverified", 0)),
            float64=int(data.get("float64", 0)),
            scanned=float(data.get("scanned", 1.0)),
            reverify_s=float(data.get("reverify_s", 0.0)),
            failures=[str(x) for x in data.get("failures", [])],
            unchecked=[str(x) for x in data.get("unchecked", [])],
            updates=[WeightUpdate.from_dict(x) for x in data.get("updates", [])],
        )

    def __str__(self) -> str:
        text = f"run-time checks: {self.calls} call(s) checked, {self.reverified} re-verified"
        if self.float64:
            text += f" ({self.float64} against float64)"
        if self.scanned < 1:
            text += f", {self.scanned:.0%} scanned for NaN/inf"
        if self.updates:
            text += f"; weights updated {len(self.updates)} time(s) (last: {self.updates[-1]})"
        return text + "".join(f"; {f}" for f in self.failures)
