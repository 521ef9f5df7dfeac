"""Issue 48's smaller items: save_html into a new folder, ONNX Runtime providers checked
against what is installed, a case-blind did-you-mean, --failures without `unavailable`,
the CLI's positional arguments documented, `chain store --store` as the guide says, the
API reference's options, the docs extra's torch pin."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest
import torch

import chain as chain_module
from backends.errors import InvalidBackend, InvalidOption
from chain import Attempt, GraphRecord, Report, Status, chain
from chain.select.options import CHAIN_OPTIONS
from tests.helpers import cli_runs

ROOT = Path(__file__).resolve().parents[1]


def _report() -> Report:
    attempts = (
        Attempt("tensorrt", Status.UNAVAILABLE, "tensorrt is not installed"),
        Attempt("onnxruntime", Status.COMPILE_ERROR, "export failed: no translation"),
        Attempt("eager", Status.WON, ""),
    )
    record = GraphRecord(
        id=0, fingerprint="f", origin="forward (m.py:1)", num_nodes=3, ops={}, inputs=[],
        attempts=attempts, winner="eager",
    )  # fmt: skip
    return Report([record])


def test_save_html_into_a_missing_folder_creates_it(tmp_path: Path) -> None:
    page = _report().save_html(tmp_path / "new" / "deeper" / "r.html")
    assert page.is_file() and 'id="summary"' in page.read_text()


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None, reason="no onnxruntime")
def test_onnxruntime_provider_typo_is_refused_with_the_choices() -> None:
    import onnxruntime

    with pytest.raises(InvalidOption) as caught:
        chain(
            "onnxruntime", "eager", options={"onnxruntime": {"providers": ["CPUExecutionProvder"]}}
        )
    message = str(caught.value)
    assert "did you mean 'CPUExecutionProvider'" in message
    assert all(p in message for p in onnxruntime.get_available_providers())
    missing = [
        p for p in onnxruntime.get_all_providers() if p not in onnxruntime.get_available_providers()
    ]
    if missing:  # known, not built into this install (a GPU server's list on a CPU box):
        # accepted at chain(), declined at compile with the reason, eager answers
        backend = chain(
            "onnxruntime", "eager", options={"onnxruntime": {"providers": [missing[0]]}}
        )
        model = torch.nn.Linear(4, 2).eval()
        x = torch.randn(3, 4)
        with torch.no_grad():
            torch.testing.assert_close(torch.compile(model, backend=backend)(x), model(x))
        first = backend.report.graphs[0].attempts[0]
        assert first.status == Status.UNSUPPORTED, first
        assert f"{missing[0]} not available in this onnxruntime install" in first.reason
    ok = chain(
        "onnxruntime", "eager", options={"onnxruntime": {"providers": ["CPUExecutionProvider"]}}
    )
    assert ok.options["onnxruntime"]["providers"] == ["CPUExecutionProvider"]


def test_backend_name_in_other_case_gets_a_did_you_mean() -> None:
    with pytest.raises(InvalidBackend, match="did you mean 'onnxruntime'"):
        chain("ONNXRuntime")


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess[str]]:
    """`chain report --failures --format json` on the report above, then `chain report -h`,
    `chain repro -h` and `chain store --help`: all in one fresh process (tests/helpers.py
    cli_runs: one torch import, not four); each run by its first words."""
    saved = _report().save(tmp_path_factory.mktemp("cli") / "r.json")
    argv = {
        "failures": ["report", str(saved), "--failures", "--format", "json"],
        "report": ["report", "-h"],
        "repro": ["repro", "-h"],
        "store": ["store", "--help"],
    }
    return dict(zip(argv, cli_runs(*argv.values(), timeout=300), strict=True))


def test_failures_leave_unavailable_backends_out(
    cli: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    report = _report()
    assert [a.backend for _, a in report.attempts(failures_only=True)] == ["onnxruntime"]
    done = cli["failures"]
    assert done.returncode == 0, done.stderr
    assert "onnxruntime" in done.stdout and "tensorrt" not in done.stdout


@pytest.mark.parametrize(
    ("command", "positionals"),
    [("report", ["file"]), ("repro", ["file", "graph", "backend"])],
)
def test_cli_help_documents_positional_arguments(
    command: str, positionals: list[str], cli: dict[str, subprocess.CompletedProcess[str]]
) -> None:
    done = cli[command]
    assert done.returncode == 0, done.stderr
    section = done.stdout.split("positional arguments:")[1].split("options:")[0]
    lines = [line.split() for line in section.strip().splitlines()]
    documented = {words[0] for words in lines if len(words) > 1}
    assert set(positionals) <= documented, section


def test_store_help_and_memory_guide_agree_on_store(
    cli: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    done = cli["store"]
    assert done.returncode == 0, done.stderr
    flat = " ".join(done.stdout.split())
    assert "cache root" in flat and "decisions folder" in flat
    guide = " ".join((ROOT / "docs/guide/memory.md").read_text().split())
    assert "`chain store --store` takes either" in guide
    assert "`chain store --store` name the folder" not in guide


def test_api_reference_of_chain_lists_every_option() -> None:
    doc = chain_module.chain.__doc__ or ""
    assert [k for k in CHAIN_OPTIONS if f"`{k}`" not in doc] == []
    assert "docs/guide/options.md" not in doc  # a link, not a bare path


def test_docs_extra_pins_torch() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    [docs] = [line for line in text.splitlines() if line.startswith("docs = [")]
    assert '"torch==' in docs.replace(" ", ""), docs
