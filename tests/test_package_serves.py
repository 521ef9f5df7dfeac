"""inductor's package, built in the background once the decision is kept
(chain.select.deferred), serves the selecting process itself when it times faster than the
JIT compile it replaces, not only the next process. The timing is synthetic here (the
machine's load decides nothing): FASTER hands the package to the graph's guard; undecided
keeps the JIT compile serving (the package is still stored for the next process).

Checked after the handover: answers equal eager's at two batch sizes, from four threads,
and after the user changes the weights in place (the package takes them as inputs).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import chain
import chain.select.background as background
import chain.select.deferred as deferred
from chain.judge.timing import Timing
from chain.report.attempts import FASTER, UNDECIDED
from tests.helpers import in_threads
from tests.models import MLP

pytestmark = pytest.mark.slow  # an AOTInductor package is built in a child process


def synthetic(verdict: str) -> Callable[..., dict[str, Timing]]:
    """deferred's timing of package against JIT compile, with a set verdict."""
    speedup = 2.0 if verdict == FASTER else 1.0

    def measure(fns: Any, inputs: Any, *, baseline: str, **_: Any) -> dict[str, Timing]:
        return {
            name: Timing(0.1, 0.0, 9, 1.0 if name == baseline else speedup, 0.9, 2.1, verdict)
            for name in fns
        }

    return measure


@pytest.mark.parametrize(
    ("verdict", "grad"),
    [(FASTER, torch.inference_mode), (UNDECIDED, torch.no_grad)],
    ids=["faster-inference_mode", "undecided-no_grad"],
)
def test_a_faster_package_serves_this_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, verdict: str, grad: Any
) -> None:
    monkeypatch.setenv("CHAIN_INDUCTOR_PACKAGE", "1")
    monkeypatch.setattr(deferred, "measure", synthetic(verdict))
    torch.manual_seed(0)
    model = MLP().eval()
    backend = chain.chain(
        "inductor", "eager", eager_floor=False, memory=True, store=tmp_path / "store"
    )
    fast = torch.compile(model, backend=backend, dynamic=True)
    with grad():
        for batch in (4, 7):
            x = torch.randn(batch, 32)
            torch.testing.assert_close(fast(x), model(x))
        # new weights while the package builds: it is verified (and timed) on them
        model.load_state_dict({k: v * 0.9 for k, v in model.state_dict().items()})
        x = torch.randn(6, 32)
        torch.testing.assert_close(fast(x), model(x))
    assert deferred.wait(600)
    [record] = backend.report.graphs
    stored = [n for n in record.notes if "package stored" in n]
    assert stored, record.notes
    assert "reference recorded again: weight(s) input" in stored[0], stored[0]
    serves = "it serves this process from now on" in stored[0]
    assert serves == (verdict == FASTER), stored[0]

    def calls() -> None:
        with grad():
            for batch in (3, 9):
                x = torch.randn(batch, 32)
                torch.testing.assert_close(fast(x), model(x))

    in_threads(calls)
    with torch.no_grad():  # the user's own update, in place: the package reads it
        for p in model.parameters():
            p.mul_(0.5)
    with grad():
        x = torch.randn(5, 32)
        torch.testing.assert_close(fast(x), model(x))
    [record] = backend.report.graphs
    assert record.winner == "inductor"


def test_a_provisional_decision_gets_its_package_once_the_race_confirms_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decision made on noisy evidence (a busy machine) builds no package: it is
    provisional. Once the run-time race confirms it on quiet evidence, its package is built
    and, timed faster than the JIT compile, serves this process. The timings and the noise
    are set here (synthetic); the package is real."""
    import chain.select.recall as recall
    import chain.select.timed as timed

    monkeypatch.setenv("CHAIN_INDUCTOR_PACKAGE", "1")
    monkeypatch.setattr(timed, "measure", synthetic(FASTER))  # inductor 2x eager
    monkeypatch.setattr(deferred, "measure", synthetic(FASTER))  # package 2x its JIT
    monkeypatch.setattr(recall, "not_decided", lambda record: "noisy timing (set by the test)")
    torch.manual_seed(0)
    model = MLP().eval()
    backend = chain.chain("inductor", "eager", memory=True, store=tmp_path / "store")
    fast = torch.compile(model, backend=backend, dynamic=True)
    with torch.inference_mode():
        for batch in (4, 7):
            x = torch.randn(batch, 32)
            torch.testing.assert_close(fast(x), model(x))
    [record] = backend.report.graphs
    assert record.winner == "inductor", record.attempts
    assert any("remembered as provisional" in n for n in record.notes), record.notes
    assert not any("package" in n for n in record.notes), record.notes  # none for now

    note = backend.recall.confirm(record.id)  # as the race does once it decides quietly
    assert note is not None and "package is being built in the background" in note, note
    assert deferred.wait(600)
    [record] = backend.report.graphs
    stored = [n for n in record.notes if "package stored" in n]
    assert stored and "it serves this process from now on" in stored[0], record.notes
    with torch.no_grad():
        for batch in (3, 9):
            x = torch.randn(batch, 32)
            torch.testing.assert_close(fast(x), model(x))
    assert backend.recall.confirm(record.id) is not None  # a second confirmation builds nothing
    assert deferred.wait(60)


def test_a_graph_its_dynamic_recompile_replaced_is_built_only_once_called_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batch 1, then 4: dynamo's second graph (the batch dynamic, 2 or more) serves every
    later batch but 1, so the first graph's package waits until a batch-1 call comes
    (parked on its guard), instead of a compile nobody may use."""
    monkeypatch.setenv("CHAIN_INDUCTOR_PACKAGE", "1")
    monkeypatch.setattr(deferred, "measure", synthetic(FASTER))
    monkeypatch.setattr(background, "SETTLE_S", 120.0)  # no build before `wait()`, even loaded
    torch.manual_seed(0)
    model = MLP().eval()
    backend = chain.chain(
        "inductor", "eager", eager_floor=False, memory=True, store=tmp_path / "store"
    )
    fast = torch.compile(model, backend=backend)  # static first, then the batch dynamic
    with torch.no_grad():
        for batch in (1, 4, 6):
            x = torch.randn(batch, 32)
            torch.testing.assert_close(fast(x), model(x))
    assert deferred.wait(600)
    first, second = backend.report.graphs
    assert second.recompiles == first.id, second
    assert any("not built yet: graph 1 recompiled" in n for n in first.notes), first.notes
    assert not any("package stored" in n for n in first.notes), first.notes
    assert any("package stored" in n for n in second.notes), second.notes
    with torch.no_grad():
        x = torch.randn(1, 32)  # the first graph's shape: its call queues the build
        torch.testing.assert_close(fast(x), model(x))
    assert deferred.wait(600)
    first = backend.report.graphs[0]
    assert any("package stored" in n for n in first.notes), first.notes
    with torch.no_grad():  # and it serves: batch 1 and the rest, the weights changed
        for p in model.parameters():
            p.mul_(0.5)
        for batch in (1, 5):
            x = torch.randn(batch, 32)
            torch.testing.assert_close(fast(x), model(x))
