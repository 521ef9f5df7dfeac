"""Weights belong to the user: an update between calls (load_state_dict, an optimizer step,
an in-place LoRA merge, an EMA copy_, a swapped nn.Parameter) is served, refreshed where a
backend froze the weights, and recorded; only a write during the winner's call is damage."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import fx, nn

from chain import chain, weights_changed
from chain.dynamo import DEFAULT_CHAIN
from chain.run.watch.updates import JUDGED, OFTEN_CALLS, too_often
from chain.select.isolation import WeightsDamaged

SHAPES = ((3, 16), (5, 16))


class Net(nn.Module):
    """Two linears and a LayerNorm (its weight and bias kept by name in ONNX)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.norm(self.fc1(x))))


def live(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """A plain callable backend that reads the weights it is handed (live)."""
    return lambda *args: gm.forward(*args)


def _new_state(model: nn.Module, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=g) * 0.3 for k, v in model.state_dict().items()}


def _load(model: nn.Module, step: int) -> None:
    model.load_state_dict(_new_state(model, step))


def _optimizer(model: nn.Module, step: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model.train()
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(step))
    model(x.to(model.fc1.weight.device)).pow(2).sum().backward()
    opt.step()
    opt.zero_grad()
    model.eval()


def _lora(model: nn.Module, step: int) -> None:
    with torch.no_grad():
        delta = torch.randn(32, 4) @ torch.randn(4, 16)
        model.fc1.weight.add_(0.1 * delta.to(model.fc1.weight.device))


def _peft_merge(model: nn.Module, step: int) -> None:
    """As PEFT merges a LoRA adapter (`base_layer.weight.data += delta`): behind the version
    counter, then said with `chain.weights_changed`."""
    delta = torch.randn(32, 4) @ torch.randn(4, 16)
    model.fc1.weight.data += 0.1 * delta.to(model.fc1.weight.device)
    assert weights_changed(model) == len([*model.parameters(), *model.buffers()])


def _ema(model: nn.Module, step: int) -> None:
    shadow = _new_state(model, step)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(0.5 * p + 0.5 * shadow[name].to(p.device))


def _swap(model: nn.Module, step: int) -> None:
    model.fc2.weight = nn.Parameter(torch.randn_like(model.fc2.weight))


UPDATES = {"load_state_dict": _load, "optimizer": _optimizer, "lora_add": _lora,
           "ema_copy": _ema, "swap_parameter": _swap, "peft_merge": _peft_merge}  # fmt: skip
BACKENDS = {"onnxruntime": "onnxruntime", "callable": live, "eager": "eager"}


def _serve(
    backend_name: str, update: str, *, mode: str = "no_grad", dynamic: bool = False,
    rounds: int = 3, calls: int = 4, device: str = "cpu", backend: Any = None,
) -> Any:  # fmt: skip
    """Compile, call, update, call...: every answer equals eager's on the current weights."""
    torch.manual_seed(0)
    model = Net().eval().to(device)
    backend = backend or chain(BACKENDS[backend_name], measure=False)
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    context = torch.inference_mode if mode == "inference_mode" else torch.no_grad
    for step in range(rounds):
        if step:
            UPDATES[update](model, step)
        for shape in SHAPES:
            with context():
                x = torch.randn(shape, device=device)
                for _ in range(calls):
                    got = compiled(x)
                    want = model(x)
                    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    return backend


def _updates(backend: Any) -> list[Any]:
    return [u for g in backend.report.graphs if g.watch for u in g.watch.updates]


@pytest.mark.parametrize("update", sorted(UPDATES))
@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_an_update_between_calls_is_served_and_recorded(name: str, update: str) -> None:
    backend = _serve(name, update)
    seen = _updates(backend)
    assert len(seen) >= 2, backend.report.graphs  # one per update, before the next answer
    assert all(u.backend == name if name != "callable" else "live" for u in seen), seen
    assert all(g.winner == backend.report.graphs[0].winner for g in backend.report.graphs)
    if name == "onnxruntime":
        assert all(u.refresh_s > 0 and ("initializers" in u.how or "re-export" in u.how)
                   for u in seen), seen  # fmt: skip


_ON_CUDA = {
    "default chain": lambda: chain(*DEFAULT_CHAIN),
    "cudagraphs": lambda: chain("cudagraphs", measure=False),
    "inductor+graphs": lambda: chain("inductor", cuda_graphs=True, measure=False),
}


@pytest.mark.cuda
@pytest.mark.parametrize("update", sorted(UPDATES))
@pytest.mark.parametrize("name", sorted(_ON_CUDA))
def test_an_update_on_a_gpu_is_served(name: str, update: str) -> None:
    """On CUDA the default chain, cudagraphs and inductor under CUDA graphs (which keep
    weights at fixed addresses) serve each kind of update right, in both grad modes."""
    for mode in ("no_grad", "inference_mode"):
        backend = _serve("eager", update, mode=mode, device="cuda", backend=_ON_CUDA[name]())
        assert all(g.winner for g in backend.report.graphs), backend.report.graphs


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("name", ["onnxruntime", "callable"])
def test_updates_under_each_grad_mode_and_dynamic_shapes(
    name: str, mode: str, dynamic: bool
) -> None:
    backend = _serve(name, "load_state_dict", mode=mode, dynamic=dynamic)
    assert len(_updates(backend)) >= 2


def test_inductor_reads_updates_live() -> None:
    pytest.importorskip("torch._inductor")
    torch.manual_seed(0)
    model = Net().eval()
    backend = chain("inductor", measure=False)
    compiled = torch.compile(model, backend=backend, dynamic=False)
    x = torch.randn(3, 16)
    with torch.no_grad():
        for step in range(3):
            if step:
                _lora(model, step)
                _swap(model, step) if step == 2 else None
            for _ in range(3):
                torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    seen = _updates(backend)
    assert seen and all(u.backend == "inductor" and "live" in u.how for u in seen), seen


@pytest.mark.parametrize("name", ["onnxruntime", "callable"])
def test_updates_from_four_threads(name: str) -> None:
    torch.manual_seed(0)
    model = Net().eval()
    backend = chain(BACKENDS[name], measure=False)
    compiled = torch.compile(model, backend=backend, dynamic=False)
    xs = [torch.randn(3, 16) for _ in range(4)]
    with torch.no_grad():
        compiled(xs[0])
    errors: list[BaseException] = []
    for step in range(1, 4):
        _load(model, step)
        with torch.no_grad():
            wants = [model(x) for x in xs]
        start = threading.Barrier(4)

        def work(t: int, start: threading.Barrier, want: torch.Tensor) -> None:
            start.wait()
            try:
                with torch.no_grad():
                    for _ in range(5):
                        torch.testing.assert_close(compiled(xs[t]), want, rtol=1e-4, atol=1e-5)
            except BaseException as exc:  # the test's own failure, reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(t, start, wants[t])) for t in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert not errors, errors[0]
    assert len(_updates(backend)) == 3, _updates(backend)  # one each, whichever thread saw it


def writes_a_weight_in_its_call(
    gm: fx.GraphModule, example_inputs: list[Any]
) -> Callable[..., Any]:
    """Right on its first call (selection's), then adds 1 to a weight during each call."""
    count = [0]

    def run(*args: Any) -> Any:
        count[0] += 1
        if count[0] > 1:
            weight = next(a for a in args if isinstance(a, nn.Parameter))
            with torch.no_grad():
                weight.add_(1.0)
        return gm.forward(*args)

    return run


def test_a_write_during_the_winners_call_is_still_damage(guard_path: str) -> None:
    torch.manual_seed(0)
    model = Net().eval()
    backend = chain(writes_a_weight_in_its_call, measure=False)
    compiled = torch.compile(model, backend=backend, dynamic=False)
    x = torch.randn(3, 16)
    with torch.no_grad():
        with pytest.raises(WeightsDamaged, match=r"\(call 1\) changed weight\(s\) fc1.weight"):
            compiled(x)  # the first real call writes: seen across that call
        with pytest.raises(WeightsDamaged):
            compiled(x)  # every call raises until the weights are reloaded
        _load(model, 7)  # new weights of the user's: served again, by eager
        torch.testing.assert_close(compiled(x), model(x))
    assert backend.report.graphs[0].winner == "eager"


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_a_write_behind_the_counters_is_damage_until_said(mode: str) -> None:
    """A `.data` merge left unsaid is taken as a backend's write: a re-verification sees it
    and every call raises. `chain.weights_changed(model)` then makes it the user's update:
    served again, on the merged weights."""
    torch.manual_seed(0)
    model = Net().eval()
    backend = chain(live, measure=False, reverify_rate=0.5)
    compiled = torch.compile(model, backend=backend, dynamic=False)
    x = torch.randn(3, 16)
    context = torch.inference_mode if mode == "inference_mode" else torch.no_grad
    with context():
        torch.testing.assert_close(compiled(x), model(x))
        model.fc1.weight.data += 0.5  # PEFT's merge, unsaid
        with pytest.raises(WeightsDamaged):
            for _ in range(500):  # until a re-verification fingerprints fc1
                compiled(x)
        weights_changed(model)
        for _ in range(20):
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)


def test_frequent_updates_are_weighed_against_what_the_winner_saves() -> None:
    """Synthetic: refreshing pays when the calls between updates save more than it costs."""
    assert too_often([10, 20], 0.5, None) is None  # too few updates to judge
    close = list(range(3, 3 + 2 * JUDGED, 2))
    assert too_often(close, 0.05, None) is not None  # untimed: every 2 calls is frequent
    far = list(range(0, (OFTEN_CALLS + 5) * JUDGED, OFTEN_CALLS + 5))
    assert too_often(far, 0.05, None) is None
    # 1 ms saved a call, updates every 100 calls: a 50 ms refresh pays, a 500 ms one does not
    spaced = [100 * k for k in range(JUDGED)]
    assert too_often(spaced, 0.05, 1e-3) is None
    why = too_often(spaced, 0.5, 1e-3)
    assert why is not None and "every 100.0 calls" in why and "500.0 ms" in why


def test_frequent_updates_step_a_refreshing_winner_down_for_a_live_one() -> None:
    torch.manual_seed(0)
    model = Net().eval()
    backend = chain("onnxruntime", live, measure=False)
    compiled = torch.compile(model, backend=backend, dynamic=False)
    x = torch.randn(3, 16)
    with torch.no_grad():
        for step in range(12):
            if step:
                _lora(model, step)
            for _ in range(2):
                torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    graph = backend.report.graphs[0]
    assert graph.winner == "live", graph.attempts
    ort = graph.attempts[0]
    assert ort.status.value == "slower" and "weights updated every" in ort.reason, ort
    stepped = [u for u in graph.watch.updates if u.how.startswith("stepped down")]
    assert len(stepped) == 1, graph.watch.updates
