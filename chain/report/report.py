"""The report: every graph's record, a summary, and its forms (JSON file, table, markdown, CSV)."""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.table import Table
from rich.text import Text

from backends.common.files import UnsafeFile, atomic_write, read_bounded
from chain.report import json_fields as jf
from chain.report.columns import Column, fitted_table, markdown, printable, texts, to_csv
from chain.report.json_fields import deeper_than, short
from chain.report.records import FAILURES, Attempt, GraphRecord, Status
from chain.report.regions import region_lines
from chain.report.texts import (
    BUCKET_COLUMNS,
    bucket_rows,
    noise_flag,
    recompile_text,
)

if TYPE_CHECKING:
    from chain.report.bucket_stats import Bucket

log = logging.getLogger("chain")

VERSION = 2  # 2: per attempt error, eager_error, error_ratio, spread_ms; eager_spread_ms
READABLE = (1, 2)  # version 1 files load with those fields empty


class ReportError(ValueError):
    """A report file that cannot be read: missing, not JSON, or not shaped like a report."""


ATTEMPT_COLUMNS: tuple[Column[tuple[GraphRecord, Attempt]], ...] = (
    Column("graph", lambda ga: ga[0].id),
    Column("backend", lambda ga: ga[1].backend),
    Column("status", lambda ga: ga[1].status.value),
    Column("compile s", lambda ga: ga[1].compile_s, ".2f", numeric=True, optional=True),
    Column("latency ms", lambda ga: ga[1].latency_ms, ".3f", numeric=True, optional=True),
    Column("speedup", lambda ga: ga[1].speedup, ".2f", numeric=True),
    Column("max err", lambda ga: ga[1].max_abs_err, ".1e", numeric=True, optional=True),
    Column("err/eager", lambda ga: ga[1].error_ratio, ".2f", numeric=True, optional=True),
    Column("reason", lambda ga: ga[1].reason, wrap=True, stretch=True),
)


GRAPH_COLUMNS: tuple[Column[GraphRecord], ...] = (
    Column("graph", lambda g: g.id),
    Column("origin", lambda g: g.origin, wrap=True, stretch=True),
    Column("nodes", lambda g: g.num_nodes, optional=True),
    Column("eager ms", lambda g: g.eager_ms, ".3f", optional=True),
    Column("winner", lambda g: g.winner, wrap=True),
    Column("timing", noise_flag, wrap=True, optional=True),
    Column("recompiles", recompile_text, wrap=True),
    Column("notes", lambda g: g.notes, lambda notes: "; ".join(notes), wrap=True),
)


_STYLES = {
    Status.WON: "bold green",
    Status.SLOWER: "yellow",
    Status.NOT_TRIED: "dim",
    Status.UNAVAILABLE: "dim",
}


# what --failures lists: `unavailable` is not a failure of the backend (a CPU machine
# has no TensorRT), only of the machine; it stays in the full table
SHOWN_FAILURES = FAILURES - {Status.UNAVAILABLE}

MAX_BYTES = 64 << 20  # a report of thousands of graphs is a few MiB
MAX_DEPTH = 64  # a report nests about 6 deep; `details` and `inputs` a little more


def _read(path: str | os.PathLike[str]) -> bytes:
    """The bytes of a regular file of at most MAX_BYTES; anything else is a ReportError.

    Read through the file layer (files.read_bounded): opened without blocking and checked on
    the open descriptor, so a FIFO put in place of the file cannot hang the reader, nor a
    link to /dev/zero fill memory. A symlink the user names is followed to its target.
    """
    try:
        return read_bounded(path, MAX_BYTES, follow_symlinks=True)
    except FileNotFoundError:
        raise ReportError(f"{path}: no such file") from None
    except UnsafeFile as e:
        raise ReportError(str(e)) from None
    except OSError as e:
        raise ReportError(f"{path}: cannot read: {e.strerror or e}") from None


def _parse(path: str | os.PathLike[str], raw: bytes) -> Any:
    """JSON from `raw`; bare NaN and Infinity are still read (older writers emitted them)."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ReportError(f"{path}: not UTF-8 text: {e.reason} at byte {e.start}") from None
    except json.JSONDecodeError as e:
        raise ReportError(f"{path}: not valid JSON (truncated?): {e}") from None
    except RecursionError:
        raise ReportError(f"{path}: nested too deeply to be a report") from None
    except ValueError as e:  # e.g. an integer of more digits than Python converts
        raise ReportError(f"{path}: not valid JSON: {e}") from None
    if deeper_than(data, MAX_DEPTH):
        raise ReportError(f"{path}: nested more than {MAX_DEPTH} deep: not a report")
    return data


@dataclass(frozen=True)
class Report:
    """All graph records of one chain, in compile order."""

    graphs: list[GraphRecord] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Graphs per winner, and the end-to-end figure: eager time over winner time summed
        over the timed graphs whose timing holds, so each graph weighs as much as its eager
        time. Noisy graphs are left out of it and summed apart (`noisy_*`)."""
        winners = Counter(g.winner or "none" for g in self.graphs)
        sums = {False: [0.0, 0.0], True: [0.0, 0.0]}  # noisy? -> [eager ms, winner ms]
        left_out = []
        for g in self.graphs:
            won = g.winning_attempt
            if g.eager_ms is not None and won is not None and won.latency_ms is not None:
                sums[g.noisy][0] += g.eager_ms
                sums[g.noisy][1] += won.latency_ms
                if g.noisy:
                    left_out.append(g.id)
        (eager, winner), (noisy_eager, noisy_winner) = sums[False], sums[True]
        return {
            "graphs": len(self.graphs),
            "winners": dict(winners.most_common()),
            "noisy": sum(g.noisy for g in self.graphs),  # graphs whose figures may not hold
            "eager_ms": round(eager, 6) if winner else None,
            "winner_ms": round(winner, 6) if winner else None,
            "speedup": round(eager / winner, 4) if winner else None,
            "noisy_graphs": left_out,  # timed but noisy: left out of the figures above
            "noisy_eager_ms": round(noisy_eager, 6) if noisy_winner else None,
            "noisy_winner_ms": round(noisy_winner, 6) if noisy_winner else None,
            "noisy_speedup": round(noisy_eager / noisy_winner, 4) if noisy_winner else None,
        }

    def to_dict(self) -> dict[str, Any]:
        """The report as standard JSON values: a NaN or infinite figure as a string."""
        return jf.standard(
            {
                "version": VERSION,
                "graphs": [g.to_dict() for g in self.graphs],
                "summary": self.summary(),
            }
        )

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write JSON atomically: a crash leaves the old file or the new one, never half.

        The file gets the usual permissions (0666 less the umask, as `open()` gives); an
        existing file keeps its own. Only a regular file is replaced: a symlink, FIFO,
        device or folder at `path` is UnsafeFile (an OSError), left as it was. A missing
        directory is created, and a warning on the `chain` logger names it.
        """
        target = Path(path)
        if not target.parent.is_dir():
            target.parent.mkdir(parents=True, exist_ok=True)
            log.warning("Report.save: created the missing directory %s", target.parent)
        from chain.report.look.provenance import tagged  # repros trust what this machine wrote

        data = tagged(json.loads(jf.dumps(self.to_dict(), default=str)))
        return atomic_write(target, jf.dumps(data, indent=2, default=str))

    def save_html(self, path: str | os.PathLike[str]) -> Path:
        """Write the report as one self-contained HTML page (chain.report.look.html)."""
        from chain.report.look import html

        return html.save(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Report:
        """Read a saved report; ReportError says what is wrong with the file, in one line.

        The file may be hostile: a FIFO or device is refused before it is read (it could
        block forever), a file over MAX_BYTES before it is read, nesting deeper than
        MAX_DEPTH and fields of the wrong type after.
        """
        data = _parse(path, _read(path))
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, data: Any, source: str = "report") -> Report:
        if not isinstance(data, dict) or "graphs" not in data:
            raise ReportError(f"{source}: not a backend-chain report (no 'graphs' key)")
        if data.get("version") not in READABLE:
            raise ReportError(
                f"{source}: report version {short(data.get('version'))}, "
                f"expected one of {', '.join(map(str, READABLE))}"
            )
        if not isinstance(data["graphs"], list):
            raise ReportError(f"{source}: 'graphs' should be a list, got {short(data['graphs'])}")
        try:
            return cls([GraphRecord.from_dict(g) for g in data["graphs"]])
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
            raise ReportError(
                f"{source}: malformed graph record: {type(e).__name__}: {e}"
            ) from None

    # -- views --------------------------------------------------------------------------

    HEADERS = tuple(c.name for c in ATTEMPT_COLUMNS)
    GRAPH_HEADERS = tuple(c.name for c in GRAPH_COLUMNS)

    def attempts(self, failures_only: bool = False) -> list[tuple[GraphRecord, Attempt]]:
        """(graph, attempt) for every attempt, or only the failed ones: one row each."""
        return [
            (g, a)
            for g in self.graphs
            for a in g.attempts
            if not failures_only or a.status in SHOWN_FAILURES
        ]

    def rows(self, failures_only: bool = False) -> list[list[str]]:
        """One row per attempt: graph, backend, status, the figures and the reason."""
        return texts(ATTEMPT_COLUMNS, self.attempts(failures_only))

    def graph_rows(self) -> list[list[str]]:
        """One row per graph: where it came from, its size, eager's latency and the winner."""
        return texts(GRAPH_COLUMNS, self.graphs)

    def summary_line(self) -> str:
        """What holds first (the end-to-end figure over graphs timed cleanly, each weighed
        by its eager time), then the winners, then the noisy graphs, apart and marked."""
        s = self.summary()
        winners = ", ".join(f"{printable(k)}: {v}" for k, v in s["winners"].items()) or "none"
        parts = []
        if s["speedup"] is not None:
            clean = s["graphs"] - len(s["noisy_graphs"])
            parts.append(
                f"{s['speedup']:.2f}x end to end over {clean} graph(s) whose timing holds "
                f"(eager {s['eager_ms']:.3f} ms / winners {s['winner_ms']:.3f} ms)"
            )
        elif s["noisy_speedup"] is not None:
            parts.append("no end-to-end figure: every timed graph was noisy")
        parts.append(f"{s['graphs']} graph(s); winners: {winners}")
        if s["noisy_speedup"] is not None:
            ids = ", ".join(map(str, s["noisy_graphs"]))
            parts.append(
                f"left out: {s['noisy']} noisy graph(s), their figures may not hold "
                f"(graph(s) {ids}): eager "
                f"{s['noisy_eager_ms']:.3f} ms / winners {s['noisy_winner_ms']:.3f} ms "
                f"= {s['noisy_speedup']:.2f}x"
            )
        elif s["noisy"]:
            parts.append(f"{s['noisy']} noisy graph(s): their figures may not hold")
        return "; ".join(parts)

    def table(self, failures_only: bool = False, width: int | None = None) -> Group:
        """Rich tables: the graphs, then their attempts (all, or only the failures).

        `width`: the terminal's; columns that would not fit are left out (empty ones, then
        the optional figures) and cells wrap on words, so nothing is cut mid-word; None
        keeps every column. With `failures_only`, each failure's whole reason follows.
        """
        graphs = fitted_table(
            GRAPH_COLUMNS,
            self.graphs,
            width,
            title="backend-chain report: graphs",
            title_justify="left",
        )
        attempts = fitted_table(
            ATTEMPT_COLUMNS,
            self.attempts(failures_only),
            width,
            lambda row: _STYLES.get(row[1].status, "red"),
            title="attempts",
            title_justify="left",
            caption=self.summary_line(),
            caption_justify="left",
        )
        buckets = self.buckets_table(width)
        reasons = self.full_reasons() if failures_only else []
        races = [Text(printable(line), overflow="fold") for line in self.race_lines()]
        races += [Text(printable(line), overflow="fold") for line in region_lines(self.graphs)]
        return Group(
            graphs, attempts, *([buckets] if buckets is not None else []), *races, *reasons
        )

    def race_lines(self) -> list[str]:
        """Per raced graph (chain.judge.race): who serves, who challenges, the evidence so
        far, each promotion, retirement or drop with its call number."""
        out = []
        for graph in self.graphs:
            race = graph.race
            if race is None:
                continue
            out.append(f"graph {graph.id}: {race}")
            out += [f"  {name}: {verdict}" for name, verdict in race.evidence.items()]
        return out

    def full_reasons(self) -> list[Text]:
        """Each failed attempt's whole reason, a paragraph each, wrapped on words (a word
        wider than the terminal folds): the table may shorten a reason, not this."""
        out = [Text("reasons in full:", style="bold")] if self.attempts(True) else []
        for graph, attempt in self.attempts(True):
            head = f"graph {graph.id}, {attempt.backend} ({attempt.status.value}): "
            out.append(Text(printable(head + attempt.reason), overflow="fold"))
        return out

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        """`rich.print(report)`: the tables fitted to the console's width."""
        yield self.table(width=options.max_width)

    def buckets(self) -> list[tuple[GraphRecord, Bucket]]:
        """(graph, bucket) for every per-shape bucket (chain.run.buckets): one row each."""
        return [(g, b) for g in self.graphs if g.buckets for b in g.buckets.buckets]

    def bucket_rows(self) -> list[list[str]]:
        """One row per bucket: graph, shape, state, who serves it, calls, speedup, where it
        was decided and why it lost (the table, markdown and HTML read these columns)."""
        return bucket_rows(self.graphs)

    def buckets_table(self, width: int | None = None) -> Table | None:
        """The graphs' per-shape buckets (chain.run.buckets), one row each; None when none."""
        rows = self.buckets()
        if not rows:
            return None
        return fitted_table(BUCKET_COLUMNS, rows, width, title="buckets", title_justify="left")

    def render(self, failures_only: bool = False, width: int = 120) -> str:
        """The tables as plain text `width` columns wide (what `str(report)` prints)."""
        console = Console(file=io.StringIO(), width=width, force_terminal=False)
        console.print(self.table(failures_only, width))
        return console.file.getvalue()  # type: ignore[attr-defined]

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython's display: the tables as text, at most 120 columns."""
        printer.text("Report(...)" if cycle else self.render().rstrip("\n"))

    def _repr_html_(self) -> str:
        """A notebook's display: the HTML page's summary and tables, without its charts or
        any script (chain.report.look.html.fragment)."""
        from chain.report.look import html

        return html.fragment(self)

    def to_markdown(self, failures_only: bool = False) -> str:
        """GitHub-flavoured markdown: the graphs table, the attempts table, the summary."""
        lines = [
            *markdown(GRAPH_COLUMNS, self.graph_rows()),
            "",
            *markdown(ATTEMPT_COLUMNS, self.rows(failures_only)),
        ]
        if buckets := self.bucket_rows():
            lines += ["", *markdown(BUCKET_COLUMNS, buckets)]
        if races := self.race_lines():
            lines += ["", *(f"- {line.strip()}" for line in races)]
        if regions := region_lines(self.graphs):
            lines += ["", "```", *regions, "```"]
        return "\n".join(lines) + f"\n\n{self.summary_line()}\n"

    def to_csv(self, failures_only: bool = False) -> str:
        """CSV: one line per attempt, the attempts table's columns with raw values."""
        return to_csv(ATTEMPT_COLUMNS, self.attempts(failures_only))

    def __str__(self) -> str:
        """The tables at the terminal's width (`print(report)`), 120 columns when piped."""
        width = shutil.get_terminal_size().columns if sys.stdout.isatty() else 120
        return self.render(width=width)
