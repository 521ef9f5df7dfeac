"""Dynamo's recompile limit: past it a new shape or mode runs uncompiled, outside the chain.
The graph of a frame's last compile under the limit says so."""

from __future__ import annotations

import pytest
import torch

from chain import chain


@pytest.mark.parametrize("mode", ["inference_mode", "no_grad"])
def test_the_last_compile_under_the_limit_says_what_follows(mode: str) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval()
    backend = chain("eager", memory=False)
    context = torch.inference_mode if mode == "inference_mode" else torch.no_grad
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=2), context():
        compiled = torch.compile(model, backend=backend, dynamic=False)
        for batch in (2, 3, 4):  # static sizes: each batch is a compile; the third is past it
            x = torch.randn(batch, 8)
            torch.testing.assert_close(compiled(x), model(x))
    first, last = backend.report.graphs
    assert not any("recompile_limit" in n for n in first.notes), first.notes
    [note] = [n for n in last.notes if "recompile_limit" in n]
    assert note.startswith("compile 2 of this frame: dynamo's recompile_limit is 2")
    assert "runs uncompiled, in eager" in note
    torch._dynamo.reset()


def test_no_note_below_the_limit() -> None:
    model = torch.nn.Linear(8, 8).eval()
    backend = chain("eager", memory=False)
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(model, backend=backend)
        for batch in (2, 3, 4):  # the second compile makes the batch dynamic: two graphs
            compiled(torch.randn(batch, 8))
    assert len(backend.report.graphs) == 2
    assert not any("recompile_limit" in n for g in backend.report.graphs for n in g.notes)
    torch._dynamo.reset()
