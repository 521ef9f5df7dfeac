"""The report: every graph's record, a summary, and its forms (JSON file, table, markdown)."""

from __future__ import annotations

import io
import json
import logging
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from backends.common.files import atomic_write
from chain.records import FAILURES, GraphRecord, Status

log = logging.getLogger("chain")

VERSION = 2  # 2: per attempt error, eager_error, error_ratio, spread_ms; eager_spread_ms
READABLE = (1, 2)  # version 1 files load with those fields empty
_NUMERIC = frozenset({"compile s", "latency ms", "speedup", "max err", "err/eager"})


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
        """Write JSON atomically: a crash leaves the old file or the new one, never half.

        The file gets the usual permissions (0666 less the umask, as `open()` gives). A
        missing directory is created, and a warning on the `chain` logger names it.
        """
        target = Path(path)
        if not target.parent.is_dir():
            target.parent.mkdir(parents=True, exist_ok=True)
            log.warning("Report.save: created the missing directory %s", target.parent)
        return atomic_write(target, json.dumps(self.to_dict(), indent=2, default=str))

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
        if data.get("version") not in READABLE:
            raise ReportError(
                f"{source}: report version {data.get('version')!r}, "
                f"expected one of {', '.join(map(str, READABLE))}"
            )
        try:
            return cls([GraphRecord.from_dict(g) for g in data["graphs"]])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ReportError(
                f"{source}: malformed graph record: {type(e).__name__}: {e}"
            ) from None

    # -- views --------------------------------------------------------------------------

    def rows(self, failures_only: bool = False) -> list[list[str]]:
        """One row per attempt: graph, backend, status, the figures and the reason."""
        out = []
        for g in self.graphs:
            for a in g.attempts:
                if failures_only and a.status not in FAILURES:
                    continue
                out.append(
                    [
                        str(g.id),
                        a.backend,
                        a.status.value,
                        _fmt(a.compile_s, ".2f"),
                        _fmt(a.latency_ms, ".3f"),
                        _fmt(a.speedup, ".2f"),
                        _fmt(a.max_abs_err, ".1e"),
                        _fmt(a.error_ratio, ".2f"),
                        a.reason,
                    ]
                )
        return out

    HEADERS = (
        "graph",
        "backend",
        "status",
        "compile s",
        "latency ms",
        "speedup",
        "max err",
        "err/eager",
        "reason",
    )
    GRAPH_HEADERS = ("graph", "origin", "nodes", "eager ms", "winner", "notes")

    def graph_rows(self) -> list[list[str]]:
        """One row per graph: where it came from, its size, eager's latency and the winner."""
        return [
            [
                str(g.id),
                g.origin,
                str(g.num_nodes),
                _fmt(g.eager_ms, ".3f"),
                g.winner or "-",
                "; ".join(g.notes),
            ]
            for g in self.graphs
        ]

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

    def table(self, failures_only: bool = False) -> Group:
        """Rich tables: the graphs, then their attempts (all, or only the failures)."""
        graphs = Table(title="backend-chain report: graphs", title_justify="left")
        for h in self.GRAPH_HEADERS:
            graphs.add_column(h, overflow="fold", no_wrap=h in ("graph", "nodes", "eager ms"))
        for row in self.graph_rows():
            graphs.add_row(*(Text(c) for c in row))  # text, not rich markup: '[gpu]' stays
        attempts = Table(
            title="attempts",
            title_justify="left",
            caption=self.summary_line(),
            caption_justify="left",
        )
        for h in self.HEADERS:
            attempts.add_column(
                h,
                overflow="fold",
                no_wrap=h != "reason",
                ratio=1 if h == "reason" else None,
                justify="right" if h in _NUMERIC else "left",
            )
        styles = {
            Status.WON.value: "bold green",
            Status.SLOWER.value: "yellow",
            Status.NOT_TRIED.value: "dim",
            Status.UNAVAILABLE.value: "dim",
        }
        for row in self.rows(failures_only):
            attempts.add_row(*(Text(c) for c in row), style=styles.get(row[2], "red"))
        return Group(graphs, attempts)

    def render(self, failures_only: bool = False, width: int = 120) -> str:
        """The tables as plain text (what `str(report)` prints)."""
        console = Console(file=io.StringIO(), width=width, force_terminal=False)
        console.print(self.table(failures_only))
        return console.file.getvalue()  # type: ignore[attr-defined]

    def to_markdown(self, failures_only: bool = False) -> str:
        """GitHub-flavoured markdown: the graphs table, the attempts table, the summary."""

        def table(headers: Sequence[str], rows: list[list[str]]) -> list[str]:
            cells = [[c.replace("|", "\\|").replace("\n", " ") for c in r] for r in rows]
            return [
                "| " + " | ".join(headers) + " |",
                "|" + "|".join("---" for _ in headers) + "|",
                *("| " + " | ".join(r) + " |" for r in cells),
            ]

        lines = [
            *table(self.GRAPH_HEADERS, self.graph_rows()),
            "",
            *table(self.HEADERS, self.rows(failures_only)),
        ]
        return "\n".join(lines) + f"\n\n{self.summary_line()}\n"

    def __str__(self) -> str:
        return self.render()
