"""What the run-time checks did on one graph: counts and the failure, kept on its record."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


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
        )

    def __str__(self) -> str:
        text = f"run-time checks: {self.calls} call(s) checked, {self.reverified} re-verified"
        if self.float64:
            text += f" ({self.float64} against float64)"
        if self.scanned < 1:
            text += f", {self.scanned:.0%} scanned for NaN/inf"
        return text + "".join(f"; {f}" for f in self.failures)
