"""Issue 37's front door: one import style, origins in the user's model, reasons without
addresses, tables that fit 80 and 120 columns, missing packages `unavailable`, option
conflicts `InvalidOption`, a quiet stderr, notebook reprs, and the store's cache root."""

from __future__ import annotations

import importlib.util
import inspect
import io
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console
from torch import nn

import chain as chain_module
from backends.errors import InvalidOption, Unsupported, one_line
from backends.registry import dynamo_available
from chain import ExportResult, Report, Status, chain, export, load
from chain.bench import zoo
from chain.memory.tools import main as store_main
from chain.report.records import Attempt, GraphRecord

ROOT = Path(__file__).parent.parent
needs_transformers = pytest.mark.skipif(zoo.available() is not None, reason=str(zoo.available()))


# -- 1. one import style ----------------------------------------------------------------


def test_the_factory_carries_the_modules_public_names() -> None:
    """After `from chain import chain`, `chain.export` is the module's export, not an error."""
    assert chain.export is export is chain_module.export
    assert chain.load is load is chain_module.load
    assert chain.chain is chain and chain.Report is Report
    for name in chain_module.__all__:
        assert getattr(chain, name) is getattr(chain_module, name), name


def test_export_through_the_factory_keeps_stderr_quiet(capfd: pytest.CaptureFixture[str]) -> None:
    """The quick start's import, then the export section's call: a program, and no note on
    stderr about graph code the repro writer could not keep."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)).eval()
    args = (torch.randn(2, 8),)
    result = chain.export(model, args)
    assert isinstance(result, ExportResult)
    torch.testing.assert_close(result.program.module()(*args), model(*args))
    err = capfd.readouterr().err
    assert "graph code not kept" not in err, err


# -- 2. origin and store labels: the model class, not transformers' decorators ---------------


def _raw(name: str) -> nn.Module:
    """The zoo's transformers model itself (not the benchmark's LastHidden wrapper)."""
    model = zoo.build(name)
    return model.model.eval()  # type: ignore[return-value]


def _method_lines(cls: type, method: str = "forward") -> range:
    """The source lines of `cls.method`, decorators unwrapped."""
    lines, first = inspect.getsourcelines(inspect.unwrap(getattr(cls, method)))
    return range(first, first + len(lines))


@needs_transformers
@pytest.mark.parametrize(("name", "cls", "file"), [
    ("bert", "BertModel", "modeling_bert.py"),
    ("bloom", "BloomModel", "modeling_bloom.py"),  # its forward has a deprecation decorator
])  # fmt: skip
def test_origin_of_a_transformers_model_is_its_forward(name: str, cls: str, file: str) -> None:
    model = _raw(name)
    backend = chain("eager", measure=False, memory=False)
    with torch.inference_mode():
        torch.compile(model, backend=backend)(*zoo.inputs(name, 0))
    origin = backend.report.graphs[0].origin
    match = re.match(rf"{cls}\.forward \({re.escape(file)}:(\d+)\)", origin)
    assert match, origin
    assert int(match.group(1)) in _method_lines(type(model)), origin
    for wrapper in ("wrapper", "generic.py", "deprecation.py", "wrapped_func"):
        assert wrapper not in origin


@needs_transformers
def test_store_takes_the_cache_root_and_labels_entries_by_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`chain store --store $CHAIN_CACHE_DIR list` finds the decisions folder inside it, and
    each entry leads with the model class it came from."""
    model = _raw("bert")
    backend = chain("eager", memory=True, store=tmp_path / "decisions")
    with torch.inference_mode():
        torch.compile(model, backend=backend)(*zoo.inputs("bert", 0))
    keys = [p.stem for p in (tmp_path / "decisions").glob("*.json")]
    assert len(keys) == 1
    for store in (tmp_path, tmp_path / "decisions"):
        assert store_main(["--store", str(store), "list"]) == 0
        out = capsys.readouterr().out
        assert f"1 entry in {tmp_path / 'decisions'}" in out, out
        [line] = [x for x in out.splitlines() if x.startswith(keys[0])]
        assert line.split("  ")[1].startswith("BertModel.forward (modeling_bert.py:"), line


def test_a_folder_with_entries_of_its_own_is_the_store_itself(tmp_path: Path) -> None:
    """A `decisions` subfolder does not hide entries kept in the folder named."""
    from chain.memory.tools import resolved

    (tmp_path / "decisions").mkdir()
    assert resolved(tmp_path) == tmp_path / "decisions"
    (tmp_path / ("ab" * 16 + ".json")).write_text("{}")
    assert resolved(tmp_path) == tmp_path
    assert resolved("redis://localhost:6379/0") == "redis://localhost:6379/0"


# -- 3. reasons without memory addresses ------------------------------------------------------


def _sym_sqrt() -> None:
    """A function whose repr carries an address."""


def test_reasons_carry_no_memory_addresses() -> None:
    assert " at 0x" in repr(_sym_sqrt)
    assert one_line(TypeError(f"cannot lower {_sym_sqrt!r}")) == (
        "TypeError: cannot lower <function _sym_sqrt>"
    )
    assert Unsupported(f"no converter for {_sym_sqrt!r}").reason == (
        "no converter for <function _sym_sqrt>"
    )

    def lowers_nothing(gm: torch.fx.GraphModule, inputs: list[Any]) -> Any:
        raise RuntimeError(f"unsupported target {_sym_sqrt!r}")

    backend = chain(lowers_nothing, "eager", measure=False, memory=False)
    with torch.no_grad():
        torch.compile(nn.Linear(3, 3), backend=backend)(torch.randn(2, 3))
    failed = backend.report.graphs[0].attempts[0]
    assert failed.status is Status.COMPILE_ERROR
    assert failed.reason == "RuntimeError: unsupported target <function _sym_sqrt>"


# -- 4. the terminal table at 80 and 120 columns ---------------------------------------------

REASON = (
    "Unsupported: the ONNX exporter failed: aten.sym_sqrt has no symbolic function registered "
    "(torch.onnx.errors.UnsupportedOperatorErrorWithAVeryLongNameIndeed) while converting "
    "node sym_sqrt_default of the attention block; the chain falls back to the next backend"
)
BOX = re.compile("[\u2500-\u257f\\s]+")  # rich's box drawing, and blanks


def _report() -> Report:
    record = GraphRecord(
        id=0,
        fingerprint="f",
        origin="BertModel.forward (modeling_bert.py:640); ends at a graph break: sqrt",
        num_nodes=123,
        ops={},
        inputs=[],
        winner="eager",
        attempts=(
            Attempt("onnxruntime", Status.UNSUPPORTED, REASON),
            Attempt("tvm", Status.UNAVAILABLE, "tvm is not installed: pip install apache-tvm"),
            Attempt("eager", Status.WON, compile_s=0.01, latency_ms=0.123, speedup=1.0),
        ),
    )
    return Report([record])


def _vocabulary(report: Report) -> set[str]:
    """Every word the tables may show: cells, headers, titles, the summary."""
    texts = [*report.GRAPH_HEADERS, *report.HEADERS, report.summary_line()]
    texts += [c for row in report.rows() + report.graph_rows() for c in row]
    texts += ["backend-chain report: graphs", "attempts", "reasons in full:"]
    texts += [f"graph {a}, {b} ({c}):" for a, b, c in [(0, "onnxruntime", "unsupported"),
                                                       (0, "tvm", "unavailable")]]  # fmt: skip
    return {w for t in texts for w in t.split()}


@pytest.mark.parametrize("width", [80, 120])
def test_the_table_fits_and_never_breaks_a_word(width: int) -> None:
    report = _report()
    out = report.render(width=width)
    assert max(map(len, out.splitlines())) <= width
    words = _vocabulary(report)
    for token in BOX.split(out):
        if token:
            cut = token.endswith("\u2026") and any(w.startswith(token[:-1]) for w in words)
            assert token in words or cut, f"{token!r} is a piece of a word at {width} columns"
    assert "reason" in out and "sym_sqrt_default" in out and "unavailable" in out
    assert ("latency ms" in out) is (width == 120)  # an optional figure, left out at 80
    console = Console(file=io.StringIO(), width=width)
    console.print(report)  # rich's own print fits the console the same way
    assert console.file.getvalue() == out  # type: ignore[attr-defined]


def test_failures_add_every_reason_in_full() -> None:
    out = _report().render(failures_only=True, width=80)
    assert REASON in " ".join(out.split())
    assert "| won |" not in out and " won " not in out


def test_cli_failures_print_the_whole_reason(tmp_path: Path) -> None:
    path = _report().save(tmp_path / "r.json")
    shown = subprocess.run(
        [sys.executable, "-m", "chain", "report", str(path), "--failures"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "120"},
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert REASON in " ".join(shown.stdout.split())
    assert max(map(len, shown.stdout.splitlines())) <= 120


# -- 5. a dynamo backend whose package is missing is unavailable -----------------------------


@pytest.mark.parametrize(("name", "module", "hint"), [
    ("tvm", "tvm", "pip install apache-tvm"),
    ("openxla", "torch_xla", "pip install torch_xla"),
])  # fmt: skip
def test_a_missing_package_is_unavailable_with_its_hint(name: str, module: str, hint: str) -> None:
    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed here")
    assert dynamo_available(name) == f"{module} is not installed: {hint}" + (
        " (https://github.com/pytorch/xla)" if module == "torch_xla" else ""
    )
    backend = chain(name, "eager", measure=False, memory=False)
    with torch.no_grad():
        torch.compile(nn.Linear(3, 3), backend=backend)(torch.randn(2, 3))
    first, last = backend.report.graphs[0].attempts
    assert (first.backend, first.status) == (name, Status.UNAVAILABLE)
    assert hint in first.reason and last.status is Status.WON


def test_dynamo_backends_that_need_nothing_stay_available() -> None:
    assert dynamo_available("aot_eager") is None


# -- 6. option conflicts ------------------------------------------------------------------------


@pytest.mark.parametrize(("options", "match"), [
    ({"measure": False, "mode": "fastest"}, "mode='fastest' needs measure=True"),
    ({"measure": False, "min_speedup": 1.1}, "min_speedup needs measure=True"),
])  # fmt: skip
def test_option_conflicts_are_invalid_option(options: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidOption, match=match):
        chain("eager", **options)


def test_options_that_agree_are_accepted() -> None:
    assert chain("eager", mode="fastest", min_speedup=1.2, memory=False).mode == "fastest"


# -- 7. stderr quiet: the exporter's warnings go to the attempt's details -------------------


class FoldsALogOfZero(nn.Module):
    """ONNX's constant folding evaluates log(0) with numpy: a RuntimeWarning, on stderr
    unless captured (T5's relative position buckets do the same)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.log(torch.arange(4.0)).clamp(min=-1.0)


def test_exporter_warnings_are_captured_not_printed(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("onnxruntime")
    monkeypatch.delenv("TORCH_LOGS", raising=False)
    monkeypatch.delenv("CHAIN_VERBOSE", raising=False)
    backend = chain("onnxruntime", "eager", measure=False, memory=False)
    x = torch.randn(2, 4)
    with torch.inference_mode():
        out = torch.compile(FoldsALogOfZero(), backend=backend)(x)
    torch.testing.assert_close(out, FoldsALogOfZero()(x))
    ort = backend.report.graphs[0].attempts[0]
    assert (ort.backend, ort.status) == ("onnxruntime", Status.WON)
    assert any("divide by zero encountered in log" in w for w in ort.details["warnings"])
    err = capfd.readouterr().err
    assert "RuntimeWarning" not in err and "divide by zero" not in err, err


@needs_transformers
def test_dynamic_bloom_prints_no_graph_dump(capfd: pytest.CaptureFixture[str]) -> None:
    """BLOOM with dynamic=True once dumped its FX graph (181 lines) on stderr."""
    pytest.importorskip("onnxruntime")
    model = zoo.build("bloom")
    backend = chain("onnxruntime", "eager", measure=False, memory=False)
    compiled = torch.compile(model, backend=backend, dynamic=True)
    with torch.inference_mode():
        for shape in range(2):
            args = zoo.inputs("bloom", shape)
            torch.testing.assert_close(compiled(*args), model(*args), rtol=1e-4, atol=1e-4)
    err = capfd.readouterr().err
    for dump in ("def forward", "graph():", "GraphModule", "RuntimeWarning"):
        assert dump not in err, err[:2000]


def test_quiet_collects_this_threads_warnings_unless_verbose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """quiet() yields the warnings raised on its thread; CHAIN_VERBOSE=1 lets them through."""
    from backends.common.quiet import quiet, verbose

    monkeypatch.delenv("TORCH_LOGS", raising=False)
    monkeypatch.setenv("CHAIN_VERBOSE", "0")
    assert not verbose()
    with quiet() as caught:
        warnings.warn("kept for the report", UserWarning, stacklevel=1)
    assert caught == [f"UserWarning: kept for the report ({Path(__file__).name}:{_line(1)})"]
    monkeypatch.setenv("CHAIN_VERBOSE", "1")
    assert verbose()
    with warnings.catch_warnings(record=True) as shown, quiet() as caught:
        warnings.simplefilter("always")
        warnings.warn("shown as usual", UserWarning, stacklevel=1)
    assert caught == [] and [str(w.message) for w in shown] == ["shown as usual"]


def _line(back: int) -> int:
    """The line `back` lines above the caller's call."""
    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None
    return frame.f_back.f_lineno - back


# -- 8. notebook reprs ----------------------------------------------------------------------------


class Printer:
    """IPython's pretty printer, as far as `_repr_pretty_` uses it."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def text(self, text: str) -> None:
        self.parts.append(text)


def test_repr_html_is_the_pages_summary_and_tables_without_script() -> None:
    page = _report()._repr_html_()
    assert page.startswith('<div class="backend-chain-report">') and page.endswith("</div>")
    assert "<script" not in page.lower() and "<html" not in page.lower()
    for needle in ('id="summary"', 'id="timeline"', 'id="graphs"', "sym_sqrt_default",
                   "BertModel.forward (modeling_bert.py:640)", "<table"):  # fmt: skip
        assert needle in page, needle
    styles = re.search(r"<style>(.*?)</style>", page, re.S)
    assert styles is not None
    for rule in styles.group(1).splitlines():  # every rule scoped: the notebook keeps its look
        assert rule.startswith(".backend-chain-report"), rule


def test_repr_pretty_is_the_text_table() -> None:
    report = _report()
    printer = Printer()
    report._repr_pretty_(printer, False)
    assert printer.parts == [report.render().rstrip("\n")]
    printer = Printer()
    report._repr_pretty_(printer, True)
    assert printer.parts == ["Report(...)"]


def test_saved_report_round_trips_with_the_new_columns(tmp_path: Path) -> None:
    """The table's optional columns change what is shown, not what is saved."""
    report = _report()
    saved = json.loads(report.save(tmp_path / "r.json").read_text())
    assert saved["graphs"][0]["attempts"][0]["reason"] == REASON
    assert Report.load(tmp_path / "r.json").graphs == report.graphs
