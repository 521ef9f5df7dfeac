"""The onnxruntime backend inside `chain("onnxruntime", "eager")`: wins, refusals, fallbacks."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from chain import Status, chain
from tests.helpers import compile_and_check
from tests.models import build, build_extra


def outcomes(backend: Any) -> list[tuple[str | None, dict[str, str]]]:
    """Per graph: the winner and each backend's status."""
    return [
        (g.winner, {a.backend: a.status.value for a in g.attempts}) for g in backend.report.graphs
    ]


@pytest.mark.parametrize("name", ["cnn", "transformer", "two_outputs"])
def test_onnxruntime_wins_and_reports_its_facts(name: str) -> None:
    model, args = build(name)
    backend = chain("onnxruntime", "eager", measure=False)
    compile_and_check(model, args, backend, atol=1e-4)
    (graph,) = backend.report.graphs
    assert graph.winner == "onnxruntime"
    details = graph.attempts[0].details
    assert details["providers"] == ["CPUExecutionProvider"]
    assert details["initializers"] > 0 and details["frozen_inputs"]


def test_graph_break_gives_two_graphs_both_on_onnxruntime() -> None:
    model, args = build("graph_break")
    backend = chain("onnxruntime", "eager", measure=False)
    compile_and_check(model, args, backend)
    assert [winner for winner, _ in outcomes(backend)] == ["onnxruntime", "onnxruntime"]


def test_unsupported_op_falls_back_to_eager_with_the_reason() -> None:
    model, args = build_extra("kthvalue")
    backend = chain("onnxruntime", "eager", measure=False)
    compile_and_check(model, args, backend)
    (graph,) = backend.report.graphs
    ort = graph.attempts[0]
    assert graph.winner == "eager"
    assert ort.status is Status.UNSUPPORTED
    assert "aten.kthvalue" in ort.reason


def test_training_graph_is_recorded_as_unsupported() -> None:
    model, args = build("mlp")
    backend = chain("onnxruntime", "eager", measure=False)
    torch.compile(model, backend=backend)(*args)  # grad mode on: an autograd graph
    (graph,) = backend.report.graphs
    assert graph.winner == "eager"
    assert graph.attempts[0].status is Status.UNSUPPORTED
    assert graph.attempts[0].reason.startswith("training graph")


def test_changed_weights_with_raise_policy_fall_back_at_run_time() -> None:
    model, (x,) = build("two_outputs")
    backend = chain(
        "onnxruntime",
        "eager",
        measure=False,
        options={"onnxruntime": {"on_weight_change": "raise"}},
    )
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        compiled(x)
        model.fc.bias.add_(1.0)
        torch.testing.assert_close(compiled(x), model(x))
    (graph,) = backend.report.graphs
    assert graph.winner == "eager"
    assert graph.attempts[0].status is Status.RUNTIME_ERROR
    assert "changed after export" in graph.attempts[0].reason


def test_unknown_option_is_rejected_at_chain_time() -> None:
    with pytest.raises(ValueError, match="on_weight_change"):
        chain("onnxruntime", "eager", options={"onnxruntime": {"threads": 2}})


def test_inference_mode_inputs_are_exported_and_run() -> None:
    model, (x,) = build("cnn")
    backend = chain("onnxruntime", "eager", measure=False)
    with torch.inference_mode():
        x = x.clone()  # an inference tensor
        out = torch.compile(model, backend=backend)(x)
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
    assert [winner for winner, _ in outcomes(backend)] == ["onnxruntime"]
