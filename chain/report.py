"""The report: every graph's record, a summary, and its forms (JSON file, table, markdown)."""

from __future__ import annotations

import io
import json
import os
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from chain.records import FAILURES, GraphRecord, Status

VERSION = 1


class ReportError(ValueError):
    """A report file that cannot be read: missing, not JSON, or not shaped like a report."""


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


@dataclass(frozen=True)
class Report:
    """All graph records of one chain, in compile order."""

    graphs: list[GraphRecord] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Graphs per winner, and eager time over winner time summed over the measured graphs."""
        winners = Counter(g.winner or "none" for g in self.graphs)
        eager = winner = 0.0
        for g in self.graphs:
            won = g.winning_attempt
            if g.eager_ms is not None and won is not None and won.latency_ms is not None:
                eager += g.eager_ms
                winner += won.latency_ms
        return {
            "graphs": len(self.graphs),
            "winners": dict(winners.most_common()),
            "eager_ms": round(eager, 6) if winner else None,
            "winner_ms": round(winner, 6) if winner else None,
            "speedup": round(eager / winner, 4) if winner else None,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "graphs": [g.to_dict() for g in self.graphs],
            "summary": self.summary(),
        }

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write JSON atomically: a crash leaves the old file or the new one, never half."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.to_dict(), indent=2, default=str)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return target

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Report:
        """Read a saved report; ReportError says what is wrong with the file, in one line."""
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ReportError(f"{path}: no such file") from None
        except (OSError, UnicodeDecodeError) as e:
            raise ReportError(f"{path}: cannot read: {e}") from None
        except json.JSONDecodeError as e:
            raise ReportError(f"{path}: not valid JSON (truncated?): {e}") from None
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, data: Any, source: str = "report") -> Report:
        if not isinstance(data, dict) or "graphs" not in data:
            raise ReportError(f"{source}: not a backend-chain report (no 'graphs' key)")
        if data.get("version") != VERSION:
            raise ReportError(
                f"{source}: report version {data.get('version')!r}, expected {VERSION}"
            )
        try:
            return cls([GraphRecord.from_dict(g) for g in data["graphs"]])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ReportError(
                f"{source}: malformed graph record: {type(e).__name__}: {e}"
            ) from None

    # -- views --------------------------------------------------------------------------

    def rows(self, failures_only: bool = False) -> list[list[str]]:
        """One row per attempt: graph, origin, backend, status, reason and the figures."""
        out = []
        for g in self.graphs:
            for i, a in enumerate(g.attempts):
                if failures_only and a.status not in FAILURES:
                    continue
                out.append(
                    [
                        str(g.id) if i == 0 or failures_only else "",
                        g.origin if i == 0 or failures_only else "",
                        a.backend,
                        a.status.value,
                        _fmt(a.compile_s, ".2f"),
                        _fmt(a.latency_ms, ".3f"),
                        _fmt(a.speedup, ".2f"),
                        _fmt(a.max_abs_err, ".1e"),
                        a.reason,
                    ]
                )
        return out

    HEADERS = (
        "graph",
        "origin",
        "backend",
        "status",
        "compile s",
        "latency ms",
        "speedup",
        "max err",
        "reason",
    )

    def summary_line(self) -> str:
        s = self.summary()
        winners = ", ".join(f"{k}: {v}" for k, v in s["winners"].items()) or "none"
        line = f"{s['graphs']} graph(s); winners: {winners}"
        if s["speedup"] is not None:
            line += (
                f"; eager {s['eager_ms']:.3f} ms / winners {s['winner_ms']:.3f} ms "
                f"= {s['speedup']:.2f}x"
            )
        return line

    def table(self, failures_only: bool = False) -> Table:
        """A rich table of the attempts (all, or only the failures)."""
        table = Table(title="backend-chain report", caption=self.summary_line())
        for h in self.HEADERS:
            table.add_column(
                h,
                overflow="fold",
                justify="right"
                if "ms" in h or h in ("compile s", "speedup", "max err")
                else "left",
            )
        styles = {
            Status.WON.value: "bold green",
            Status.SLOWER.value: "yellow",
            Status.NOT_TRIED.value: "dim",
        }
        for row in self.rows(failures_only):
            table.add_row(*row, style=styles.get(row[3], "red" if row[3] != "unavailable" else ""))
        return table

    def render(self, failures_only: bool = False, width: int = 140) -> str:
        console = Console(file=io.StringIO(), width=width, force_terminal=False)
        console.print(self.table(failures_only))
        return console.file.getvalue()  # type: ignore[attr-defined]

    def to_markdown(self, failures_only: bool = False) -> str:
        """A GitHub-flavoured markdown table with the summary line under it."""

        def cell(text: str) -> str:
            return text.replace("|", "\\|").replace("\n", " ")

        lines = [
            "| " + " | ".join(self.HEADERS) + " |",
            "|" + "|".join("---" for _ in self.HEADERS) + "|",
        ]
        lines += [
            "| " + " | ".join(cell(c) for c in row) + " |" for row in self.rows(failures_only)
        ]
        return "\n".join(lines) + f"\n\n{self.summary_line()}\n"

    def __str__(self) -> str:
        return self.render()
