"""TORCH_TRACE: the chain's decision per graph is a structured-trace artifact beside
dynamo's own entries for the same compile id."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from chain import Report
from chain.bench import zoo
from chain.report.look.trace import ARTIFACT

ROOT = Path(__file__).parent.parent

SCRIPT = """
import sys
import torch
from chain import chain
from chain.bench import zoo
from tests import faults

backend = chain(faults.raises_at_compile, faults.wrong_numbers, "eager", measure=False)
model = torch.compile(zoo.build("bert"), backend=backend)
with torch.no_grad():
    for shape in (0, 1):
        model(*zoo.inputs("bert", shape))
backend.report.save(sys.argv[1])
"""


def entries(folder: Path) -> list[tuple[dict[str, Any], str]]:
    """(metadata, payload) of every structured-trace entry in `folder`'s log files."""
    found: list[tuple[dict[str, Any], str]] = []
    for log in folder.glob("*.log"):
        for line in log.read_text().splitlines():
            if line.startswith("\t") and found:
                found[-1] = (found[-1][0], found[-1][1] + line[1:] + "\n")
            elif "] {" in line:
                found.append((json.loads(line.split("] ", 1)[1]), ""))
    return found


def compile_id(meta: dict[str, Any]) -> str:
    return f"{meta.get('frame_id')}/{meta.get('frame_compile_id')}"


@pytest.mark.skipif(zoo.available() is not None, reason=str(zoo.available()))
def test_trace_holds_the_chain_decision_of_every_graph(tmp_path: Path) -> None:
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "TORCH_TRACE": str(tmp_path / "trace"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "run.json")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = Report.load(tmp_path / "run.json")
    assert len(report.graphs) == 2  # the second shape recompiles

    found = entries(tmp_path / "trace")
    ours = {
        compile_id(meta): json.loads(payload)
        for meta, payload in found
        if meta.get("artifact", {}).get("name") == ARTIFACT
    }
    dynamo = {compile_id(meta) for meta, _ in found if "dynamo_output_graph" in meta}
    for graph in report.graphs:
        assert graph.compile_id in ours, f"no {ARTIFACT} for graph {graph.id}"
        assert graph.compile_id in dynamo  # beside dynamo's own graph of that compile
        decision = ours[graph.compile_id]
        assert decision["graph"] == graph.id
        assert decision["winner"] == "eager"
        assert [(a["backend"], a["status"], a["reason"]) for a in decision["attempts"]] == [
            (a.backend, a.status.value, a.reason) for a in graph.attempts
        ]
        assert decision["attempts"][0]["status"] == "compile_error"
        assert "converter exploded" in decision["attempts"][0]["reason"]
        assert decision["attempts"][1]["status"] == "mismatch"
