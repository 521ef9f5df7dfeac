"""Table columns declared once (name, how to read it, how to write it) for every form.

The terminal table (rich), markdown and CSV all read the same `Column`s, so adding a
field to a report is one line in one tuple, not an edit per form kept in step by position.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from rich.table import Table
from rich.text import Text

Row = TypeVar("Row")

# C0 controls but tab and newline, DEL, C1 controls (0x9b is a one-byte CSI), and the
# bidirectional overrides that reorder what a reader sees
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with terminal controls shown as escapes (`\\x1b`): a reason or a name read
    from a report cannot move the cursor, recolour or retitle the terminal."""
    return _UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


@dataclass(frozen=True)
class Column(Generic[Row]):
    """One column: its header, how to read a row's value, and how to write that value.

    `fmt`: a format spec for numbers (".3f") or a function of the value; None shows as
    "-" in the tables and as an empty cell in CSV; a list or tuple is joined by `joiner`.
    `numeric`: right-aligned in the terminal. `wrap`: may fold onto several lines there;
    `stretch`: takes the spare width.
    """

    name: str
    get: Callable[[Row], Any]
    fmt: str | Callable[[Any], str] = ""
    numeric: bool = False
    wrap: bool = False
    stretch: bool = False
    joiner: str = "; "

    def value(self, row: Row) -> Any:
        """The raw value, for CSV: numbers unformatted, lists joined, None empty."""
        value = self.get(row)
        if isinstance(value, list | tuple):
            return printable(self.joiner.join(map(str, value)))
        if isinstance(value, str):
            return printable(value)
        return "" if value is None else value

    def text(self, row: Row) -> str:
        """The value as the tables show it, terminal controls neutralized (`printable`)."""
        value = self.get(row)
        if callable(self.fmt):
            return printable(self.fmt(value))
        if isinstance(value, list | tuple):
            return printable(self.joiner.join(map(str, value))) or "-"
        return "-" if value is None else printable(format(value, self.fmt))


def texts(columns: Sequence[Column[Row]], rows: Iterable[Row]) -> list[list[str]]:
    """Every row as the tables show it."""
    return [[c.text(row) for c in columns] for row in rows]


def rich_table(columns: Sequence[Column[Any]], **options: Any) -> Table:
    """An empty rich Table with `columns` declared; `options` go to `Table` (title, ...)."""
    table = Table(**options)
    for c in columns:
        table.add_column(
            c.name,
            overflow="fold",
            no_wrap=not c.wrap,
            ratio=1 if c.stretch else None,
            justify="right" if c.numeric else "left",
        )
    return table


def cells(columns: Sequence[Column[Row]], row: Row) -> list[Text]:
    """A row for a rich table: its texts as Text, so that '[gpu]' stays text, not markup."""
    return [Text(c.text(row)) for c in columns]


def markdown(columns: Sequence[Column[Any]], rows: Iterable[Sequence[str]]) -> list[str]:
    """GitHub-flavoured markdown lines of a table of texts (`texts`)."""
    escaped = [[c.replace("|", "\\|").replace("\n", " ") for c in r] for r in rows]
    return [
        "| " + " | ".join(c.name for c in columns) + " |",
        "|" + "|".join("---:" if c.numeric else "---" for c in columns) + "|",
        *("| " + " | ".join(r) + " |" for r in escaped),
    ]


def to_csv(columns: Sequence[Column[Row]], rows: Iterable[Row]) -> str:
    """CSV with a header line of the column names and raw values (`Column.value`)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([c.name for c in columns])
    writer.writerows([c.value(row) for c in columns] for row in rows)
    return buf.getvalue()
