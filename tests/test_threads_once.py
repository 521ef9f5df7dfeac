"""One selection per graph in a process: a cold first call from 4 threads (dynamo compiles
the frame once per thread that missed its cache) selects once, every thread gets the same
winner and eager's answers (chain.select.once)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from chain import Chain, chain
from tests.models import build_extra


def _count_selections(backend: Chain, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one per selection (a run of the candidates) of `backend`."""
    runs: list[int] = []
    original = backend.selection.run

    def counted(*args: Any, **kwargs: Any) -> Any:
        runs.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(backend.selection, "run", counted)
    return runs


def _burst(compiled: Callable[..., Any], ids: torch.Tensor) -> list[torch.Tensor]:
    """Call `compiled` from 4 threads at once, two under inference_mode and two under
    no_grad; their outputs (last_hidden_state), in thread order."""
    barrier, out, errors = threading.Barrier(4), [None] * 4, []

    def call(i: int) -> None:
        try:
            mode = torch.inference_mode() if i % 2 else torch.no_grad()
            barrier.wait()
            with mode:
                out[i] = compiled(ids).last_hidden_state.clone()
        except BaseException as e:  # handed to the test's thread, which fails on it
            errors.append(e)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    return out  # type: ignore[return-value]


@pytest.mark.parametrize("dynamic", [None, True])
def test_cold_burst_from_four_threads_selects_once(
    dynamic: bool | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, (ids,) = build_extra("bert")
    backend = chain("onnxruntime", "eager", memory=False)
    selections = _count_selections(backend, monkeypatch)
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    lengths = (8, 12) if dynamic is None else (8,)  # 12: a recompile, as a dynamic graph
    for length in lengths:
        ids = torch.randint(0, 100, (2, length))
        with torch.no_grad():
            expected = model(ids).last_hidden_state
        for got in _burst(compiled, ids):
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    graphs = backend.report.graphs
    distinct = {(g.fingerprint, str(g.inputs)) for g in graphs}
    assert len(selections) == len(distinct) <= 2, [g.notes for g in graphs]
    winners = {}
    for g in graphs:  # the same graph on the same inputs: the same winner, every thread
        winners.setdefault((g.fingerprint, str(g.inputs)), set()).add(g.winner)
    assert all(len(w) == 1 for w in winners.values()), winners
    reused = [g for g in graphs if any("its decision reused" in n for n in g.notes)]
    assert len(reused) == len(graphs) - len(distinct)
