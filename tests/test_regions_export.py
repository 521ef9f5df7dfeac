"""Export of a mixed-regions winner (issue 49, chain.deploy.mixed): each region exported by
the backend that serves it, PyTorch for the others, and the program loaded and run in a
fresh process. The plan is set by the test (every other region to ONNX Runtime) and the
mixed graph's timing verdict too: what is under test is the export of a mixed graph, not
the measurement that chooses one (tests/test_regions_mix.py), so the outcome holds on a
busy machine."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import chain
import chain.select.regions.mix as mix
from tests.helpers import fresh_process
from tests.regions_models import dual, set_plan

LOAD = """
import json, sys
import torch
import chain
from torch.utils import _pytree as pytree
ids, pixels = torch.load(sys.argv[2]), torch.load(sys.argv[3])
module = chain.load(sys.argv[1]).module()
with torch.inference_mode():
    out = [t for t in pytree.tree_leaves(module(ids, pixels)) if isinstance(t, torch.Tensor)]
torch.save(out, sys.argv[4])
print(json.dumps({"outputs": len(out)}))
"""


@pytest.fixture
def every_other_region_to_onnxruntime(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan: regions 0, 2, 4... under ONNX Runtime, the others eager; kept as faster."""
    set_plan(monkeypatch, lambda i: "onnxruntime" if i % 2 == 0 else "eager")


def test_a_mixed_program_exports_each_region_by_its_backend_and_loads_fresh(
    every_other_region_to_onnxruntime: None, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    model = dual(layers=1)
    ids, pixels = torch.randint(0, 100, (2, 8)), torch.randn(2, 3, 16, 16)
    backend = chain.chain("onnxruntime", "eager", mode="fastest", regions=True)
    result = chain.export(model, (ids, pixels), backend=backend)
    [graph] = result.report.graphs
    assert graph.winner == mix.REGIONS, graph.attempts
    served = {p["name"]: p["backend"] for p in graph.winning_attempt.details["parts"]}
    assert set(served.values()) == {"onnxruntime", "eager"}, served
    assert any(n.startswith("export: mixed regions") for n in result.notes), result.notes
    exported = sorted(p["region"] for p in result.parts)
    assert exported == sorted(n for n, b in served.items() if b == "onnxruntime")
    assert all(p["backend"] == "onnxruntime" for p in result.parts)
    payloads = [
        n for n in result.program.graph.nodes if "run_payload" in str(getattr(n, "target", ""))
    ]
    assert len(payloads) == len(result.parts)

    torch.export.save(result.program, tmp_path / "mixed.pt2")
    ids, pixels = torch.randint(0, 100, (2, 8)), torch.randn(2, 3, 16, 16)  # new values
    torch.save(ids, tmp_path / "ids.pt")
    torch.save(pixels, tmp_path / "pixels.pt")
    names = ("mixed.pt2", "ids.pt", "pixels.pt", "out.pt")
    got = fresh_process(LOAD, *(str(tmp_path / n) for n in names))
    with torch.no_grad():
        want = [t for t in torch.utils._pytree.tree_leaves(model(ids, pixels))
                if isinstance(t, torch.Tensor)]  # fmt: skip
    assert got == {"outputs": len(want)}
    for out, expected in zip(torch.load(tmp_path / "out.pt"), want, strict=True):
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
