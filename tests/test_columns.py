"""Columns declared once: the terminal table, markdown and CSV read the same spec."""

from __future__ import annotations

import csv
import io

from rich.console import Console

from chain.report.columns import Column, cells, markdown, rich_table, texts, to_csv

ROWS = [
    {"name": "a|b", "ms": 1.23456, "tags": ["x", "y"]},
    {"name": "c", "ms": None, "tags": []},
]
COLUMNS: tuple[Column[dict[str, object]], ...] = (
    Column("name", lambda r: r["name"]),
    Column("latency ms", lambda r: r["ms"], ".2f", numeric=True),
    Column("tags", lambda r: r["tags"], wrap=True),
)


def test_texts_format_numbers_lists_and_missing_values() -> None:
    assert texts(COLUMNS, ROWS) == [["a|b", "1.23", "x; y"], ["c", "-", "-"]]


def test_csv_has_the_same_columns_with_raw_values() -> None:
    parsed = list(csv.reader(io.StringIO(to_csv(COLUMNS, ROWS))))
    assert parsed == [["name", "latency ms", "tags"], ["a|b", "1.23456", "x; y"], ["c", "", ""]]


def test_markdown_escapes_cells_and_aligns_numbers() -> None:
    lines = markdown(COLUMNS, texts(COLUMNS, ROWS))
    assert lines == [
        "| name | latency ms | tags |",
        "|---|---:|---|",
        "| a\\|b | 1.23 | x; y |",
        "| c | - | - |",
    ]


def test_rich_table_takes_headers_alignment_and_text_cells() -> None:
    table = rich_table(COLUMNS, title="t")
    for row in [*ROWS, {"name": "[gpu]", "ms": 2.0, "tags": []}]:
        table.add_row(*cells(COLUMNS, row))
    assert [c.header for c in table.columns] == ["name", "latency ms", "tags"]
    assert [c.justify for c in table.columns] == ["left", "right", "left"]
    assert [c.no_wrap for c in table.columns] == [True, True, False]
    console = Console(file=io.StringIO(), width=80)
    console.print(table)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert "[gpu]" in out and "1.23" in out  # text, not rich markup
