"""Wrong answers that reach the caller without a version counter moving (issue 32): a
winner that hands out one output buffer every call, one that writes the caller's input
through `.data`, and calls after the weights were damaged. Each test is the issue's repro,
asserting the right answer or the prescribed error."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import fx

from chain import chain
from chain.report.records import Status
from chain.select.isolation import WeightsDamaged
from tests.models import build, build_extra

CALLS = 200


def one_buffer(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Right values each call, always in the same output tensors (a static output buffer)."""
    held: list[torch.Tensor] = []

    def run(*args: Any) -> Any:
        out = gm.forward(*args)
        if not held:
            held.extend(o.clone() for o in out)
        for buffer, o in zip(held, out, strict=True):
            buffer.copy_(o)
        return list(held)

    return run


def writes_data(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Right outputs; after its first run (selection's), the caller's floating input scaled
    through `.data` (no version bump)."""
    calls = [0]

    def run(*args: Any) -> Any:
        calls[0] += 1
        out = gm.forward(*args)
        if calls[0] > 1:
            x = next(a for a in args if type(a) is torch.Tensor and a.is_floating_point())
            x.data.mul_(0.5)
        return out

    return run


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_a_winner_handing_out_one_buffer_is_demoted_at_its_second_call(
    guard_path: str, mode: str
) -> None:
    model, (x,) = build("mlp")
    backend = chain(one_buffer, "eager", measure=False)
    compiled = torch.compile(model, backend=backend)
    grad = torch.inference_mode if mode == "inference_mode" else torch.no_grad
    inputs = [torch.randn_like(x) for _ in range(CALLS)]
    with grad():
        kept = [compiled(a) for a in inputs]  # the caller holds every answer
        expected = [model(a) for a in inputs]
    wrong = sum(not torch.allclose(k, e) for k, e in zip(kept, expected, strict=True))
    assert wrong <= 1, f"{wrong} of {CALLS} answers overwritten"  # the one it overwrote
    graph = backend.report.graphs[0]
    first = graph.attempts[0]
    assert (first.backend, first.status) == ("one_buffer", Status.MISMATCH), first
    assert "memory of output 0 of an earlier call" in first.reason
    assert graph.winner == "eager"


def test_answers_the_caller_drops_may_share_memory(guard_path: str) -> None:
    """The allocator hands freed memory out again: outputs nobody holds are not a reuse."""
    model, (x,) = build("mlp")
    backend = chain("eager", measure=False)
    inductor_like = chain(lambda gm, ex: gm.forward, "eager", measure=False)
    for b in (backend, inductor_like):
        compiled = torch.compile(model, backend=b)
        with torch.no_grad():
            for _ in range(50):
                torch.testing.assert_close(compiled(x), model(x))
        assert all(a.status is not Status.MISMATCH for a in b.report.graphs[0].attempts)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_a_winner_writing_the_input_through_data_is_caught_and_the_input_restored(
    mode: str,
) -> None:
    model, (x,) = build("mlp")
    backend = chain(writes_data, "eager", measure=False)
    compiled = torch.compile(model, backend=backend)
    grad = torch.inference_mode if mode == "inference_mode" else torch.no_grad
    changed = 0
    with grad():
        for _ in range(CALLS):
            a = torch.randn_like(x)
            before = a.clone()
            torch.testing.assert_close(compiled(a), model(before))
            changed += not torch.equal(a, before)
    graph = backend.report.graphs[0]
    first = graph.attempts[0]
    assert (first.backend, first.status) == ("writes_data", Status.MISMATCH), first
    assert "no version counter moved; restored" in first.reason
    assert graph.winner == "eager"
    # the guard's first call is not re-verified: its write reaches the caller; the second
    # is, and its write is undone before the call returns
    assert changed <= 1


def _scale_weight_quietly(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """From its third call, doubles a weight behind its version counter."""
    calls = [0]

    def run(*args: Any) -> Any:
        calls[0] += 1
        if calls[0] > 2:
            weight = next(a for a in args if isinstance(a, torch.nn.Parameter))
            weight.data.mul_(2.0)
        return gm.forward(*args)

    return run


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_after_weights_damaged_every_call_raises_until_they_are_reloaded() -> None:
    model, _ = build_extra("bert")
    pristine = _state(model)
    backend = chain(_scale_weight_quietly, "eager", measure=False)
    compiled = torch.compile(model, backend=backend, dynamic=False)
    ids = torch.randint(0, 100, (2, 8))
    with torch.no_grad():
        want = model(ids).last_hidden_state
        answers, raised = 0, 0
        for _ in range(50):
            try:
                got = compiled(ids).last_hidden_state
            except WeightsDamaged:
                raised += 1
                continue
            answers += 1
            assert raised == 0, "an answer after WeightsDamaged, from the damaged weights"
            assert torch.equal(got, want) or answers <= 2
        assert raised >= 45
        model.load_state_dict(pristine)  # the weights whole again: the graph serves again
        for _ in range(5):
            torch.testing.assert_close(compiled(ids).last_hidden_state, want)


def test_after_weights_damaged_no_thread_gets_an_answer_from_them() -> None:
    """Under 8 threads: once a call raised WeightsDamaged, no call started after it answers,
    in any thread; wrong answers can come only from calls in flight before the damage was
    seen (the fault damages on every call; re-verification samples). How many calls are in
    flight then depends on the machine's load: the order, not the count, is asserted (a
    count of at most 3 answers a thread failed once at load 2: 27 answers in 200 calls)."""
    model, _ = build_extra("bert")
    backend = chain(_scale_weight_quietly, "eager", measure=False)
    compiled = torch.compile(model, backend=backend, dynamic=False)
    ids = torch.randint(0, 100, (2, 8))
    with torch.no_grad():
        want = model(ids).last_hidden_state.clone()
        compiled(ids)
    outcomes: list[list[str]] = [[] for _ in range(8)]
    answered: list[float] = []  # when each call that answered started
    raised_at: list[float] = []  # when each WeightsDamaged reached its caller
    start = threading.Barrier(8)

    def work(t: int) -> None:
        start.wait()
        with torch.no_grad():
            for _ in range(25):
                began = time.perf_counter()
                try:
                    got = compiled(ids).last_hidden_state
                except WeightsDamaged:
                    raised_at.append(time.perf_counter())
                    outcomes[t].append("raised")
                    continue
                answered.append(began)
                right = torch.allclose(got, want, atol=1e-5)
                outcomes[t].append("right" if right else "wrong")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for seen in outcomes:
        first = seen.index("raised")
        assert set(seen[first:]) == {"raised"}, seen  # no answer after its first raise
    late = [t for t in answered if t > min(raised_at)]
    assert not late, f"{len(late)} calls started after the damage was seen answered"


def test_a_model_built_under_inference_mode_runs_and_says_why_onnxruntime_declined() -> None:
    """Its weights are inference tensors: no version counter to read (the chain's checks
    read none), and ONNX Runtime, which freezes weights, declines with the reason."""
    with torch.inference_mode():
        model, (x,) = build("mlp")
        backend = chain("onnxruntime", "eager", eager_floor=False)
        compiled = torch.compile(model, backend=backend)
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model(x))
    first, last = backend.report.graphs[0].attempts
    assert first.status is Status.UNSUPPORTED and "inference tensors" in first.reason, first
    assert last.status is Status.WON
