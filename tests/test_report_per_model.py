"""A report per compiled model: backend="chain" keeps graphs of different models apart
(`chain.report_for(compiled)`, `last_chain()`)."""

from __future__ import annotations

import pytest
import torch

from chain import chain, last_chain, report_for
from tests.models import build

OPTIONS = {"backends": ["eager"], "measure": False}


def _called(name: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    model, args = build(name)
    compiled = torch.compile(model, backend="chain", options=dict(OPTIONS))
    with torch.inference_mode():
        torch.testing.assert_close(compiled(*args), model(*args))
    return model, compiled


def _origins(report: object) -> set[str]:
    return {g.origin for g in report.graphs}  # type: ignore[attr-defined]


def test_backend_chain_keeps_each_models_graphs_apart() -> None:
    _, mlp = _called("mlp")
    _, cnn = _called("cnn")
    mlp_report, cnn_report = report_for(mlp), report_for(cnn)
    assert mlp_report.graphs and cnn_report.graphs
    assert not _origins(mlp_report) & _origins(cnn_report)
    used = last_chain()  # the latest graph's chain: the CNN's, without the MLP's graphs
    assert used is not None and used.report is cnn_report
    # a second MLP compiled alike: dynamo serves it the first MLP's graphs (equal
    # torch.compile calls share dynamo's cache), so it shares that report, and no other
    graphs = len(mlp_report.graphs)
    _, mlp2 = _called("mlp")
    assert report_for(mlp2) is mlp_report
    assert len(mlp_report.graphs) == graphs


def test_report_for_a_compiled_function_and_a_chain_object() -> None:
    backend = chain("eager", measure=False)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) + 1

    by_object = torch.compile(fn, backend=backend)
    by_name = torch.compile(fn, backend="chain", options=dict(OPTIONS))
    x = torch.randn(4, 4)
    with torch.no_grad():
        torch.testing.assert_close(by_object(x), fn(x))
        torch.testing.assert_close(by_name(x), fn(x))
    assert report_for(by_object) is backend.report
    assert len(report_for(by_name).graphs) == 1
    assert report_for(by_name) is not backend.report


def test_report_for_something_not_compiled_by_a_chain_says_so() -> None:
    model, _ = build("mlp")
    with pytest.raises(ValueError, match=r"was not compiled by torch\.compile"):
        report_for(model)
    with pytest.raises(ValueError, match=r"was not compiled by torch\.compile"):
        report_for(torch.compile(model, backend="eager"))
