"""The run-time race with real backends (chain.select.racing, chain.run.race): a challenger
compiled at the graph's second call is raced against the winner on sampled calls and promoted when
faster; one that answers wrong or raises leaves the race with the reason; every answer
stays eager's, under both grad modes, at two shapes, with weights that change and from
threads. Speeds here differ by design (a backend that sleeps 2 ms a call), so the outcome
holds on a busy machine."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import fx

from chain import chain
from chain.judge import race
from tests.models import MLP, tiny_bert

SLEEP_S = 2e-3
RATE = 0.5  # the race's share of serving time here: many pairs in few calls (the wiring
# is under test; the 2% default is tests/test_race.py's)


@pytest.fixture(autouse=True)
def _fast_race(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(race, "RATE", RATE)
    monkeypatch.setattr(race, "PROVISIONAL_RATE", RATE)


MAX_CALLS = 3000  # the race decides well within this, also on a busy machine


def slow(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """The graph as eager runs it, 2 ms later: really slower."""

    def run(*args: Any) -> Any:
        time.sleep(SLEEP_S)
        return gm.forward(*args)

    return run


def quick(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """The graph as eager runs it (a twin of eager)."""
    return lambda *args: gm.forward(*args)


def wrong_after(calls: int) -> Callable[..., Any]:
    """A backend right on its first `calls` calls (it passes verification), then 10% off."""

    def compile_wrong(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        seen = [0]

        def run(*args: Any) -> Any:
            seen[0] += 1
            out = gm.forward(*args)
            if seen[0] <= calls:
                return out
            return tuple(o * 1.1 for o in out) if isinstance(out, tuple) else out * 1.1

        return run

    compile_wrong.__name__ = "wrong_after"
    return compile_wrong


def raises_after(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    seen = [0]

    def run(*args: Any) -> Any:
        seen[0] += 1
        if seen[0] > 8:  # before it could be promoted (8 pairs and 3 in a row at least)
            raise RuntimeError("device lost")
        return gm.forward(*args)

    return run


def _serve(
    compiled: Callable[..., Any],
    model: torch.nn.Module,
    inputs: list[Any],
    calls: int,
    mode: str = "no_grad",
    until: Callable[[], Any] | None = None,
) -> int:
    """Call and compare with eager `calls` times, or until `until()` holds (checked every
    50 calls); the calls made."""
    context = torch.inference_mode if mode == "inference_mode" else torch.no_grad
    with context():
        for n in range(calls):
            if until is not None and n % 50 == 0 and until():
                return n
            x = inputs[n % len(inputs)]
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    return calls


def _events(backend: Any, what: str) -> list[Any]:
    return [e for g in backend.report.graphs if g.race for e in g.race.events if e.what == what]


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_a_faster_challenger_compiled_later_is_promoted(mode: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = MLP().eval()
    backend = chain(slow, "eager", eager_floor=False, challengers=[quick], store=tmp_path,
                    memory=True)  # fmt: skip
    compiled = torch.compile(model, backend=backend)
    inputs = [torch.randn(4, 32)]
    _serve(compiled, model, inputs, 1, mode)  # selects: slow serves
    [graph] = backend.report.graphs
    assert graph.winner == "slow", graph
    _serve(compiled, model, inputs, MAX_CALLS, mode, until=lambda: _events(backend, "promoted"))
    _serve(compiled, model, inputs, 50, mode)  # served by the new winner
    [graph] = backend.report.graphs
    assert graph.race is not None and graph.race.server in ("quick", "eager"), graph.race
    promoted = [e for e in graph.race.events if e.what == "promoted"]
    # quick and eager are twins, both 2 ms ahead of slow: either may win the race
    assert promoted and "over slow" in promoted[0].why, graph.race
    assert graph.winner == promoted[0].backend
    assert any("challenger quick compiled and verified" in n for n in graph.notes), graph.notes
    lost = next(a for a in graph.attempts if a.backend == "slow")
    assert "lost the run-time race" in lost.reason
    # the decision stored at selection (slow) is refuted: forgotten, the next process selects
    assert any("forgotten" in n and "promoted at run time" in n for n in graph.notes)
    # the report shows the race: text, markdown and HTML
    from chain.report.look import html

    for shown in (backend.report.render(width=200), backend.report.to_markdown()):
        assert f"call {promoted[0].call}: {promoted[0].backend} promoted" in shown
    assert f'id="race-{graph.id}"' in html.fragment(backend.report)
    assert graph.race.race_s <= RATE * graph.race.served_s + 0.05  # its share, plus a pair


def costly_at_first(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """A twin of eager whose first 4 runs take 0.3 s each more: a CUDA graph tree recording,
    triton autotuning its kernels (on an H200 those starved the race of pairs)."""
    seen = [0]

    def run(*args: Any) -> Any:
        seen[0] += 1
        if seen[0] <= 4:
            time.sleep(0.3)
        return gm.forward(*args)

    return run


def test_a_challengers_first_runs_are_its_compiles_not_the_races(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At the default 2% budget, a challenger's costly first runs are paid when it joins
    (warmed up, untimed, in its note), so its pairs come at the usual pace and it is promoted.
    Charged to the race, 1.2 s at 2% would space the next pair 60 s of serving away (not
    promoted in 6,000 calls)."""
    monkeypatch.setattr(race, "RATE", 0.02)
    monkeypatch.setattr(race, "PROVISIONAL_RATE", 0.01)
    torch.manual_seed(0)
    model = MLP().eval()
    backend = chain(slow, "eager", eager_floor=False, challengers=[costly_at_first])
    compiled = torch.compile(model, backend=backend)
    inputs = [torch.randn(4, 32), torch.randn(4, 32)]
    _serve(compiled, model, inputs, 2)
    _serve(compiled, model, inputs, 2 * MAX_CALLS, until=lambda: _events(backend, "promoted"))
    [graph] = backend.report.graphs
    assert any("costly_at_first" in n and "warmed up by 3 runs" in n for n in graph.notes), (
        graph.notes
    )
    promoted = _events(backend, "promoted")
    assert promoted and promoted[0].backend in ("costly_at_first", "eager"), graph.race
    # its share, plus a pair or two; a first run in it alone would be 0.3 s
    assert graph.race is not None and graph.race.race_s < 0.02 * graph.race.served_s + 0.1, (
        graph.race
    )


@pytest.mark.parametrize(
    ("challenger", "why"),
    [(wrong_after(3), "answered differently from the server"), (raises_after, "raised")],
    ids=["wrong", "raises"],
)
def test_a_failing_challenger_leaves_the_race_and_answers_stay_right(
    challenger: Callable[..., Any], why: str
) -> None:
    torch.manual_seed(0)
    model, (ids,) = tiny_bert()
    model.eval()
    backend = chain(slow, "eager", eager_floor=False, challengers=[challenger])
    compiled = torch.compile(model, backend=backend, dynamic=False)  # a graph per length
    inputs = [ids, ids[:, :5].contiguous()]
    _serve(compiled, model, inputs, 2)
    _serve(compiled, model, inputs, MAX_CALLS, until=lambda: _events(backend, "dropped"))
    dropped = [e for e in _events(backend, "dropped") if e.backend == challenger.__name__]
    assert dropped and why in dropped[0].why, backend.report.graphs


def test_racing_from_four_threads_with_weights_that_change() -> None:
    torch.manual_seed(0)
    model = MLP().eval()
    backend = chain(slow, "eager", eager_floor=False, challengers=[quick])
    compiled = torch.compile(model, backend=backend)
    inputs = [torch.randn(4, 32), torch.randn(4, 32)]
    _serve(compiled, model, inputs, 2)  # warmed up on one thread: call 2 prepares challengers
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(seed: int) -> None:
        try:
            with torch.no_grad():
                for n in range(150):
                    x = inputs[(n + seed) % 2]
                    with lock:  # the answer and eager's on the same weights
                        want = model(x)
                        got = compiled(x)
                    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
                    if seed == 0 and n == 75:
                        with lock, torch.no_grad():
                            model.net[0].weight.mul_(0.5)  # the user's in-place update
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    [graph] = backend.report.graphs
    assert graph.race is not None and graph.race.pairs > 0


def _load_state_dict(model: torch.nn.Module) -> None:
    model.load_state_dict({k: v * 0.9 if v.is_floating_point() else v
                           for k, v in model.state_dict().items()})  # fmt: skip


def _sgd_step(model: torch.nn.Module) -> None:
    with torch.enable_grad(), torch.inference_mode(False):
        ids = torch.randint(0, 100, (2, 8))
        model(ids).last_hidden_state.square().mean().backward()
        torch.optim.SGD(model.parameters(), lr=0.5).step()
        model.zero_grad()


def _lora_merge(model: torch.nn.Module) -> None:
    """An in-place merge of a rank-2 adapter, as peft merges one (`weight.add_(delta)`)."""
    query = model.encoder.layer[0].attention.self.query.weight
    with torch.no_grad():
        query.add_(0.5 * torch.randn(32, 2) @ torch.randn(2, 32))


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("update", [_load_state_dict, _sgd_step, _lora_merge],
                         ids=["load_state_dict", "sgd_step", "lora_merge"])  # fmt: skip
def test_a_challenger_after_a_weight_update_is_verified_on_the_new_weights(
    mode: str, update: Callable[[torch.nn.Module], None]
) -> None:
    """The user changes the weights between the first call (selection records eager's
    outputs) and the second (the challenger is verified): the reference is recorded again,
    so a correct challenger passes, and every answer is eager's on the weights of its call."""
    torch.manual_seed(0)
    model, (ids,) = tiny_bert()
    model.eval()
    backend = chain(slow, "eager", eager_floor=False, challengers=[quick])
    compiled = torch.compile(model, backend=backend, dynamic=False)
    inputs = [ids, ids[:, :5].contiguous()]
    _serve(compiled, model, inputs[:1], 1, mode)  # selects: slow serves
    update(model)
    _serve(compiled, model, inputs, 40, mode)  # call 2: quick verified, then races
    [graph, *_] = backend.report.graphs
    notes = [n for n in graph.notes if n.startswith("challenger quick")]
    assert notes and "compiled and verified" in notes[0], graph.notes
    assert "reference recorded again: weight(s) input" in notes[0], notes


def test_symbolic_graphs_are_not_challenged_and_say_why() -> None:
    torch.manual_seed(0)
    model = MLP().eval()
    backend = chain(slow, "eager", eager_floor=False, challengers=[quick])
    compiled = torch.compile(model, backend=backend, dynamic=True)
    _serve(compiled, model, [torch.randn(3, 32), torch.randn(6, 32)], 4, "inference_mode")
    [graph] = backend.report.graphs
    assert any("challengers not compiled (symbolic sizes)" in n and "quick" in n
               for n in graph.notes), graph.notes  # fmt: skip
    assert graph.race is None or "quick" not in graph.race.challengers


def test_a_decided_graph_with_no_challengers_does_not_race() -> None:
    model = MLP().eval()
    backend = chain("eager")
    compiled = torch.compile(model, backend=backend)
    _serve(compiled, model, [torch.randn(2, 32)], 3)
    [graph] = backend.report.graphs
    assert graph.race is None
