"""Dynamo's own control flow raised inside inductor's compile is not a failure of the
vector-ISA verdict (backends.inductor.isa.compile_healed).

Under `dynamic=True` a LayerNorm's float `eps` makes inductor's scalar pass raise
`TensorifyScalarRestartAnalysis` at the first compile: dynamo restarts its analysis and
compiles again (plain `torch.compile(backend="inductor")` does the same). That signal must
reach dynamo untouched: the verdict stays kept (a later process compiles under the same FX
cache key, without a probe) and nothing is logged as a failure.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

import chain
from backends.inductor import isa
from chain.report.records import Status


class Normed(torch.nn.Module):
    """A LayerNorm: its float eps is a symbolic float under dynamic=True."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x).relu()


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode])
def test_a_restart_inside_the_compile_keeps_the_verdict(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    grad_mode: type,
) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(isa, "probe", lambda: True)  # every ISA builds: the verdict is True
    if isa.SETTING not in isa.stable({}, [torch.zeros(1)]):
        pytest.skip("no vector-ISA verdict applies here (not x86-64 Linux, or set by the user)")
    kept = json.loads((tmp_path / isa.FILE).read_text())
    model = Normed().eval()
    c = chain.chain("inductor", "eager", eager_floor=False)  # speed is not the point here
    compiled = torch.compile(model, backend=c, dynamic=True)
    with caplog.at_level(logging.WARNING), grad_mode():
        for shape in [(2, 4, 8), (3, 5, 8)]:
            x = torch.randn(*shape)
            torch.testing.assert_close(compiled(x), model(x))
    assert json.loads((tmp_path / isa.FILE).read_text()) == kept  # not dropped
    failures = [r.getMessage() for r in caplog.records if "vector-ISA verdict" in r.getMessage()]
    assert failures == []
    (graph,) = c.report.graphs
    assert graph.winner == "inductor", [(a.backend, a.status, a.reason) for a in graph.attempts]
    assert [a.status for a in graph.attempts if a.backend == "inductor"] == [Status.WON]
