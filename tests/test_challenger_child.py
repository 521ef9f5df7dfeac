"""A challenger built in a child process (chain.select.challenge, `prepare`): inductor as a
challenger is exported at the graph's second call, compiled as an AOTInductor package in a
child, loaded, verified, raced and promoted, without inductor compiling in the serving
process; answers stay eager's, under both grad modes, with weights changed while the child
builds (verified on the new ones) and after the promotion; the race settled, the package
is stored with the decision and a warm start serves it. A child that hangs or dies
costs only its challenge: the model serves on. Speeds differ by design (the server
sleeps 2 ms a call), so the outcome holds under load."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from backends.inductor.build import HANG_ENV
from chain import chain
from chain.judge import race
from chain.select import deferred
from tests.models import MLP
from tests.test_race_serving import MAX_CALLS, RATE, _events, _serve, slow

pytestmark = pytest.mark.slow  # AOTInductor packages are built in child processes


@pytest.fixture(autouse=True)
def _fast_race(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHAIN_INDUCTOR_PACKAGE", "1")  # the suite turns packages off
    monkeypatch.setattr(race, "RATE", RATE)
    monkeypatch.setattr(race, "PROVISIONAL_RATE", RATE)


@pytest.fixture
def no_inductor_compile(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """inductor's JIT compile, recorded: a challenger built apart never calls it here."""
    import torch._inductor.compile_fx as compile_fx

    called: list[str] = []
    real = compile_fx.compile_fx

    def recording(*args: Any, **kwargs: Any) -> Any:
        called.append("compile_fx")
        return real(*args, **kwargs)

    monkeypatch.setattr(compile_fx, "compile_fx", recording)
    return called


def _notes(backend: Any) -> list[str]:
    return [n for g in backend.report.graphs for n in g.notes]


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_inductor_built_in_a_child_is_raced_and_promoted(
    mode: str, no_inductor_compile: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import chain.select.racing as racing

    # slow's selection counts as decided whatever the load: eager does not race it (on a
    # busy machine it would, and could be promoted first), inductor alone challenges it
    monkeypatch.setattr(racing, "not_decided", lambda record: None)
    torch.manual_seed(0)
    model = MLP().eval()
    store = dict(memory=True, store=tmp_path / "store")
    backend = chain(slow, "eager", eager_floor=False, challengers=["inductor"], **store)
    compiled = torch.compile(model, backend=backend)
    inputs = [torch.randn(4, 32), torch.randn(4, 32)]
    _serve(compiled, model, inputs, 2, mode)  # selects (slow serves); call 2 exports inductor
    assert any("challenger inductor exported at call 2" in n for n in _notes(backend))
    # the user loads new weights while the child builds: the package is verified on them
    model.load_state_dict({k: v * 0.9 for k, v in model.state_dict().items()})
    _serve(compiled, model, inputs, 2, mode)
    assert deferred.wait(600), "the child's build did not end"
    notes = _notes(backend)
    built = [n for n in notes if "challenger inductor built in a child process" in n]
    assert built and "verified, warmed up by 3 runs" in built[0], notes
    assert "; racing it against slow" in built[0], notes
    assert "reference recorded again: weight(s) input" in built[0], built
    _serve(compiled, model, inputs, MAX_CALLS, mode, until=lambda: _events(backend, "promoted"))
    [graph] = backend.report.graphs
    promoted = [e for e in graph.race.events if e.what == "promoted"] if graph.race else []
    assert promoted and promoted[0].backend == "inductor", graph.race
    assert graph.winner == "inductor"
    with torch.no_grad():  # the user's update: the package reads the weights as inputs
        model.net[0].weight.mul_(0.5)
    _serve(compiled, model, inputs, 20, mode)
    # the race settles (as it does on quiet evidence): the decision is inductor's, stored
    # with the package built for the challenge; a warm start loads it, compiling nothing
    note = backend.recall.confirm(graph.id)
    assert note and "inductor's artefact (built for its challenge) stored" in note, note
    torch._dynamo.reset()
    warm = chain(slow, "eager", eager_floor=False, challengers=["inductor"], **store)
    _serve(torch.compile(model, backend=warm), model, inputs, 5, mode)
    [graph] = warm.report.graphs
    assert graph.winner == "inductor", graph
    assert any("built from its stored artefact" in n for n in graph.notes), graph.notes
    assert no_inductor_compile == [], "inductor compiled in the serving process"


def test_a_child_that_hangs_then_dies_costs_only_its_challenge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hang = tmp_path / "hang.json"
    monkeypatch.setenv(HANG_ENV, str(hang))  # the build child writes its pid, then sleeps
    torch.manual_seed(0)
    model = MLP().eval()
    backend = chain(slow, "eager", eager_floor=False, challengers=["inductor"])
    compiled = torch.compile(model, backend=backend)
    inputs = [torch.randn(4, 32), torch.randn(4, 32)]
    _serve(compiled, model, inputs, 2)
    deadline = time.monotonic() + 120
    while not (hang.exists() and hang.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    child = json.loads(hang.read_text())["pid"]
    start = time.monotonic()
    _serve(compiled, model, inputs, 50)  # the child hangs: the model serves on
    assert time.monotonic() - start < 30  # not held by the child (2 ms a call)
    os.kill(child, signal.SIGKILL)  # then it dies
    assert deferred.wait(60)
    [graph] = backend.report.graphs
    failed = [n for n in graph.notes if "challenger inductor: its build in a child" in n]
    assert failed and "failed" in failed[0], graph.notes
    # eager may race slow (and win: slow sleeps), inductor never joined
    assert graph.winner in ("slow", "eager"), graph
    assert graph.race is None or "inductor" not in graph.race.challengers, graph.race
    _serve(compiled, model, inputs, 20)
