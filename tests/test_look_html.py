"""The HTML report: escaped reasons, every section, inline SVG charts (no script), and a
real headless Chromium rendering it without console errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import fx

from chain import Report, Status, chain
from chain.bench import zoo
from chain.report.look import html
from tests import browser, faults

HOSTILE = "<script>alert('pwned')</script> & <b>bold</b>"
ROOT = Path(__file__).parent.parent


def hostile(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
    """A compiler whose error message is HTML (as an error quoting source code may be)."""
    raise RuntimeError(HOSTILE)


@pytest.fixture(scope="module")
def report() -> Report:
    """A tiny BERT at two shapes (a recompile) through a mismatch, a compile error, eager."""
    if (why := zoo.available()) is not None:
        pytest.skip(why)
    torch._dynamo.reset()
    backend = chain(faults.wrong_numbers, hostile, "eager", measure_budget_s=0.05)
    model = zoo.build("bert")
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for shape in (0, 1):
            compiled(*zoo.inputs("bert", shape))
    return backend.report


@pytest.fixture(scope="module")
def page(report: Report, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return report.save_html(tmp_path_factory.mktemp("html") / "report.html")


def test_reasons_are_escaped(page: Path) -> None:
    text = page.read_text()
    assert "<script>alert(" not in text
    assert "&lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt; &amp; &lt;b&gt;" in text


def test_page_has_summary_timeline_and_every_attempt(report: Report, page: Path) -> None:
    text = page.read_text()
    assert 'id="summary"' in text and 'id="timeline"' in text
    assert len(report.graphs) >= 2  # the second shape recompiles
    for g in report.graphs:
        assert f'id="graph-{g.id}"' in text
        assert g.winner == "eager"
        statuses = [a.status for a in g.attempts]
        assert statuses[:2] == [Status.MISMATCH, Status.COMPILE_ERROR]
    assert text.count('<span class="mismatch">mismatch</span>') == len(report.graphs)
    assert text.count('<span class="badge">eager</span>') == len(report.graphs)
    mismatch = report.graphs[0].attempts[0]
    assert mismatch.error_ratio is not None
    assert f"{mismatch.error_ratio:.2f} / 3" in text  # the ratio against the allowance
    recompiled = [g for g in report.graphs if g.recompiles is not None]
    assert recompiled, "the second shape should recompile"
    assert f"Recompiles graph {recompiled[0].recompiles}" in text
    g = report.graphs[0]
    assert f"python -m chain repro REPORT.json {g.id} wrong_numbers -o repro/" in text
    assert text.count('<svg class="chart"') == 2  # the charts, inline SVG
    assert "<script" not in text  # nothing runs, nothing loads


def test_without_charts_the_tables_stay(report: Report, tmp_path: Path) -> None:
    text = html.save(report, tmp_path / "plain.html", charts=False).read_text()
    assert '<svg class="chart"' not in text
    assert all(f'id="graph-{g.id}"' in text for g in report.graphs)


def test_cli_writes_html_and_needs_an_output(report: Report, tmp_path: Path) -> None:
    saved = report.save(tmp_path / "run.json")
    out = tmp_path / "out.html"
    run = [sys.executable, "-m", "chain", "report", str(saved), "--format", "html"]
    done = subprocess.run([*run, "-o", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert 'id="summary"' in out.read_text()
    missing = subprocess.run(run, capture_output=True, text=True, cwd=ROOT)
    assert missing.returncode == 2
    assert "--format html needs -o FILE" in missing.stderr


@pytest.fixture(scope="module")
def headless() -> None:
    if (reason := browser.why_not()) is not None:
        pytest.skip(reason)


def test_browser_renders_the_report(headless: None, report: Report, page: Path) -> None:
    rendered = browser.load(page)
    assert rendered.console == []
    assert 'id="summary"' in rendered.dom
    assert f'<a href="#graph-{report.graphs[-1].id}">' in rendered.dom  # a timeline row
    assert rendered.dom.count('<svg class="chart"') == 2  # the inline charts


def test_browser_sees_console_errors(headless: None, tmp_path: Path) -> None:
    """The check above can fail: a page that throws shows up in the console lines."""
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>undefinedFunction();</script></body></html>")
    rendered = browser.load(bad)
    assert any("undefinedFunction is not defined" in line for line in rendered.console)
