"""No tracing at run time beside other threads (chain.run.callers): a trace on one thread
(make_fx under inductor's compile, ONNX Runtime's exporter) makes other threads' calls of
a compiled model raise. Once a second thread has called, challengers are not prepared, hot
shapes are not built, and a fallback serves eager without compiling; one thread alone
(a warm-up) still does all three. Real models, both grad modes, `dynamic=True` too."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx

from backends.registry import registry
from chain import chain
from chain.run import callers
from tests.models import MLP, tiny_bert

THREADS = 4


def test_a_trace_on_one_thread_makes_another_threads_compiled_call_raise() -> None:
    """Torch's behaviour the gate exists for: while make_fx traces on one thread, a call of
    a compiled function on another raises. If torch changes this, the gate may go."""
    compiled = torch.compile(lambda x: x * 2, backend="eager")
    x = torch.ones(3)
    compiled(x)
    tracing, called = threading.Event(), threading.Event()
    raised: list[BaseException] = []

    def traced(y: torch.Tensor) -> torch.Tensor:
        tracing.set()
        assert called.wait(30)
        return y + 1

    def other() -> None:
        assert tracing.wait(30)
        try:
            compiled(x)
        except RuntimeError as error:
            raised.append(error)
        called.set()

    thread = threading.Thread(target=other)
    thread.start()
    make_fx(traced)(x)
    thread.join(30)
    assert raised and "symbolically trace a dynamo-optimized function" in str(raised[0])


def _threads(work: Callable[[int], None]) -> list[BaseException]:
    """Run `work(k)` on THREADS threads; the errors they raised."""
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            work(k)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return errors


def _notes(backend: Any) -> str:
    return " | ".join(n for g in backend.report.graphs for n in g.notes)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_threads_after_one_call_are_served_with_nothing_traced_beside_them(
    mode: str, dynamic: bool
) -> None:
    """A tiny BERT called once per length on one thread, then by four threads at both
    lengths: the challenger (inductor, compiled on the calling thread at call 2 here) and
    the hot shapes' buckets (`dynamic=True`) are not made; no call raises, all are eager's
    answers, the weights change in between, and the notes say why."""
    torch.manual_seed(0)
    model, _ = tiny_bert()
    model.eval()
    with registry.snapshot():
        # a fixed-shape backend, for the hot shapes of a symbolic graph (dynamic=True)
        registry.register("fixed_twin", dynamic=False)(_quick)
        backend = chain("fixed_twin", "eager", challengers=["inductor"],
                        bucket_after=3 if dynamic else None)  # fmt: skip
        _serve_from_threads(model, backend, mode, dynamic)
    notes = _notes(backend)
    if dynamic:
        buckets = [b for g in backend.report.graphs if g.buckets for b in g.buckets.buckets]
        assert buckets and all("threads call" in b.reason for b in buckets), buckets
    else:
        assert re.search(r"challengers not prepared \((eager, )?inductor\)", notes), notes
        assert "threads call this process's compiled graphs" in notes
    assert all(
        g.race is None or "inductor" not in g.race.challengers for g in backend.report.graphs
    )


def _serve_from_threads(model: torch.nn.Module, backend: Any, mode: str, dynamic: bool) -> None:
    """One call per length on this thread, then THREADS threads at both lengths, twice,
    the weights changed in between (never during a call: that is damage). Every answer is
    eager's."""
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    inputs = [torch.randint(0, 100, (2, n)) for n in (8, 12)]
    context = torch.inference_mode if mode == "inference_mode" else torch.no_grad
    with context():
        wants = [model(x).last_hidden_state for x in inputs]
        for x in inputs:
            compiled(x)

    def work(k: int) -> None:
        with context():
            for n in range(6):
                i = (n + k) % 2
                got = compiled(inputs[i]).last_hidden_state
                torch.testing.assert_close(got, wants[i], rtol=1e-4, atol=1e-5)

    errors = _threads(work)
    with torch.no_grad():
        model.pooler.dense.weight.mul_(0.5)  # the user's in-place update, between calls
    with context():
        wants = [model(x).last_hidden_state for x in inputs]
    errors += _threads(work)
    assert not errors, errors


def _quick(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    return lambda *args: gm.forward(*args)


def test_one_thread_alone_still_prepares_challengers() -> None:
    """The control: the same calls from one thread race the challenger."""
    model = MLP().eval()
    backend = chain("eager", challengers=[_quick])
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(4, 32)
    with torch.no_grad():
        for _ in range(3):
            compiled(x)
    [graph] = backend.report.graphs
    assert graph.race is not None and "_quick" in graph.race.challengers, graph.notes
    assert callers.CALLERS.alone()


def test_a_fallback_beside_other_threads_serves_eager_without_compiling() -> None:
    """The winner raises at run time once threads serve: eager takes over at once, the
    chain's next backend is not compiled (it would trace), every call is answered."""
    compiled_next: list[int] = []
    failing = threading.Event()

    def flaky(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            if failing.is_set():
                raise RuntimeError("device lost")
            return gm.forward(*args)

        return run

    def counted(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        compiled_next.append(1)
        return gm.forward

    model = MLP().eval()
    backend = chain(flaky, counted, eager_floor=False)
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(4, 32)
    with torch.no_grad():
        compiled(x)
        want = model(x)

    def work(k: int) -> None:
        with torch.no_grad():
            for n in range(20):
                if k == 0 and n == 10:
                    failing.set()
                torch.testing.assert_close(compiled(x), want)

    errors = _threads(work)
    assert not errors, errors
    [graph] = backend.report.graphs
    assert graph.winner == "eager", graph.attempts
    assert compiled_next == [], "the chain's next backend was compiled beside other threads"
    assert "later backends not compiled at run time" in " | ".join(graph.notes)


def test_tracing_is_allowed_while_one_thread_calls_or_inside_dynamos_compile() -> None:
    """`may_trace`: true while one thread alone has called; after a second thread's call,
    false at run time but true inside a backend's compile (dynamo's compiling flag is up:
    a package export there is as safe as torch's own compiles)."""
    model = MLP().eval()
    compiled = torch.compile(model, backend=chain("eager"))
    x = torch.randn(4, 32)
    with torch.no_grad():
        compiled(x)
    assert callers.may_trace()
    thread = threading.Thread(target=lambda: compiled(x).sum().item())
    thread.start()
    thread.join(60)
    assert not callers.may_trace() and "2 threads call" in callers.CALLERS.why_not()
    seen: list[bool] = []

    def recording(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        seen.append(callers.may_trace())
        return gm.forward

    torch.compile(lambda y: y * 3, backend=recording)(x)
    assert seen == [True]


@pytest.mark.parametrize("watch", [True, False], ids=["checks", "no_checks"])
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_a_frozen_weight_update_beside_other_threads_is_served_without_a_trace(
    mode: str, watch: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ONNX Runtime froze the weights; the user loads new ones once a second thread has
    called. Its refresh may not re-export (a trace): it updates initializers or fails with
    the reason, and eager serves; every answer is on the new weights. With the run-time
    checks off (`watch=False`) the runner notices the change itself, under the same rule."""
    import backends.common.onnx_export as onnx_export

    torch.manual_seed(0)
    model, (ids,) = tiny_bert()
    model.eval()
    backend = chain("onnxruntime", "eager", watch=watch)
    compiled = torch.compile(model, backend=backend, dynamic=False)
    context = torch.inference_mode if mode == "inference_mode" else torch.no_grad
    with context():
        compiled(ids)
    other = threading.Thread(target=lambda: _call(compiled, ids, context))
    other.start()
    other.join(120)
    assert not callers.may_trace()
    traced: list[int] = []
    capture = onnx_export._capture
    monkeypatch.setattr(onnx_export, "_capture",
                        lambda *a, **k: traced.append(1) or capture(*a, **k))  # fmt: skip
    with torch.no_grad():
        model.load_state_dict({k: v * 0.9 if v.is_floating_point() else v
                               for k, v in model.state_dict().items()})  # fmt: skip
    for _ in range(3):
        with context():
            got = compiled(ids).last_hidden_state
            want = model(ids).last_hidden_state
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert traced == [], "re-exported beside another thread"
    [graph] = backend.report.graphs
    said = " | ".join([*graph.notes, *(a.reason for a in graph.attempts)])
    assert graph.winner == "onnxruntime" or "would trace the graph" in said, said


def _call(compiled: Any, ids: torch.Tensor, context: Any) -> None:
    with context():
        compiled(ids)
