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
    `numeric`: right-aligned in the terminal. `wrap`: may wrap onto several lines there
    (on words; a word wider than the column ends in an ellipsis); `stretch`: takes the
    spare width. `optional`: dropped (rightmost first) when the terminal is too narrow.
    """

    name: str
    get: Callable[[Row], Any]
    fmt: str | Callable[[Any], str] = ""
    numeric: bool = False
    wrap: bool = False
    stretch: bool = False
    joiner: str = "; "
    optional: bool = False

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


def rich_table(
    columns: Sequence[Column[Any]], min_widths: Sequence[int] | None = None, **options: Any
) -> Table:
    """An empty rich Table with `columns` declared; `options` go to `Table` (title, ...).

    Cells wrap on words, never inside one: a word wider than its column ends in "...".
    `min_widths`: per column, the width under which rich may not squeeze it (`fit`).
    """
    table = Table(**options)
    for i, c in enumerate(columns):
        table.add_column(
            c.name,
            overflow="ellipsis",
            no_wrap=not c.wrap,
            ratio=1 if c.stretch else None,
            justify="right" if c.numeric else "left",
            min_width=min_widths[i] if min_widths is not None else None,
        )
    return table


def cells(columns: Sequence[Column[Row]], row: Row) -> list[Text]:
    """A row for a rich table: its texts as Text, so that '[gpu]' stays text, not markup."""
    return [Text(c.text(row)) for c in columns]


WRAP_MIN = 16  # the narrowest a wrapping column gets before other columns are dropped
STRETCH_MIN = 40  # the width a stretching column (a reason) wants before others are dropped
EMPTY = ("", "-")  # what a cell without a value shows


def _widths(columns: Sequence[Column[Any]], rows: Sequence[Sequence[str]]) -> list[int]:
    """Each column's narrowest width: its longest cell and header for a column that does
    not wrap, its longest word (up to WRAP_MIN) for one that does: rich's `min_width`."""
    out = []
    for i, c in enumerate(columns):
        column = [r[i] for r in rows]
        if c.wrap:
            words = [w for text in [c.name, *column] for w in text.split()]
            out.append(min(max(map(len, words), default=1), WRAP_MIN))
        else:
            out.append(max(len(t) for t in [c.name, *column]))
    return out


def _wants(column: Column[Any], cells: Sequence[str], least: int) -> int:
    """The width a column wants when deciding what fits: a stretching one up to
    STRETCH_MIN of its longest cell, any other its narrowest (`least`)."""
    if not column.stretch:
        return least
    return max(least, min(max((len(t) for t in cells), default=0), STRETCH_MIN))


def fit(
    columns: Sequence[Column[Any]], rows: Sequence[Sequence[str]], width: int | None
) -> tuple[list[int], list[int]]:
    """(indices of the columns to show, their minimum widths) for a table `width` wide
    (None: every column). When they do not all fit (a stretching column wanting up to
    STRETCH_MIN), columns whose cells are all empty go first, then the `optional` ones
    from the right: what stays wraps on words, and is not cut mid-word."""
    widths = _widths(columns, rows)
    wants = [_wants(c, [r[i] for r in rows], widths[i]) for i, c in enumerate(columns)]
    keep = list(range(len(columns)))

    def needed() -> int:  # borders and padding: 3 per column and 1
        return sum(wants[i] + 3 for i in keep) + 1

    empty = [i for i in keep if all(r[i] in EMPTY for r in rows)]
    optional = [i for i in reversed(keep) if columns[i].optional and i not in empty]
    for i in [*empty, *optional]:
        if width is None or needed() <= width:
            break
        keep.remove(i)
    return keep, [widths[i] for i in keep]


def fitted_table(
    columns: Sequence[Column[Row]],
    rows: Sequence[Row],
    width: int | None = None,
    style: Callable[[Row], str | None] | None = None,
    **options: Any,
) -> Table:
    """A rich table of `rows` that fits `width` (`fit`): the columns that fit, each at
    least as wide as its longest word; `style(row)` gives a row's style; `options` go to
    `Table` (title, caption, ...)."""
    shown = texts(columns, rows)
    keep, widths = fit(columns, shown, width)
    table = rich_table([columns[i] for i in keep], widths, **options)
    for row, text in zip(rows, shown, strict=True):
        table.add_row(*(Text(text[i]) for i in keep), style=style(row) if style else None)
    return table


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
