"""A long compile says what it is doing (a log line off a terminal); short ones say nothing."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import fx

from chain import chain
from chain.report.look import progress
from tests.models import build


def slow(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """A compiler that takes a while (as an ONNX export or an engine build does)."""
    time.sleep(1.0)
    return gm.forward


def _run(caplog: pytest.LogCaptureFixture) -> list[str]:
    torch._dynamo.reset()
    model, args = build("mlp")
    compiled = torch.compile(model, backend=chain(slow, "eager", measure=False))
    with caplog.at_level(logging.INFO, logger="chain"), torch.no_grad():
        compiled(*args)
        compiled(torch.randn(5, *args[0].shape[1:]))  # a second shape: a second graph
    return [r.getMessage() for r in caplog.records if "compiling and verifying" in r.message]


def test_long_compile_logs_what_it_does(
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(progress, "AFTER_S", 0.05)
    lines = _run(caplog)
    assert len(lines) == 2  # one per graph
    assert all(line.startswith("compiling and verifying slow (") for line in lines)
    assert "compiling" not in capsys.readouterr().err  # no terminal here: no status line


def test_short_compile_says_nothing(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress, "AFTER_S", 30.0)
    assert _run(caplog) == []


def test_on_a_terminal_a_status_shows_and_goes(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []

    class Status:
        def start(self) -> None:
            events.append("start")

        def stop(self) -> None:
            events.append("stop")

    monkeypatch.setattr(progress, "AFTER_S", 0.01)
    monkeypatch.setattr(progress, "_terminal", lambda: True)
    monkeypatch.setattr("rich.console.Console.status", lambda self, text: Status())
    with progress.working("building an engine"):
        deadline = time.monotonic() + 30
        while "start" not in events and time.monotonic() < deadline:
            time.sleep(0.01)
    assert events == ["start", "stop"]
