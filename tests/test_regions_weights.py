"""A mixed-regions winner after the user changes the weights (round 5's first rule): each
part (ONNX Runtime's frozen initializers, inductor's graph inputs, eager) answers on the new
weights. The plan (regions alternating ONNX Runtime and inductor) and the keep verdict are
set by the test, as in tests/test_regions_export.py: what is under test is serving a mixed
graph through weight updates, not the measurement that chooses one."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import chain
import chain.select.regions.mix as mix
from tests.regions_models import dual, set_plan

BACKENDS = ("onnxruntime", "inductor")


@pytest.fixture
def alternating_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regions 0, 2, 4... under ONNX Runtime, the others under inductor; kept as faster."""
    set_plan(monkeypatch, lambda i: BACKENDS[i % 2])


def _leaves(out: Any) -> list[torch.Tensor]:
    return [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def _check(fast: Any, model: torch.nn.Module, grad: Any, lengths: tuple[int, ...]) -> None:
    for n in lengths:
        ids, pixels = torch.randint(0, 100, (2, n)), torch.randn(2, 3, 16, 16)
        with grad():
            got, want = _leaves(fast(ids, pixels)), _leaves(model(ids, pixels))
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def _load_other(model: torch.nn.Module) -> None:
    torch.manual_seed(1)
    model.load_state_dict(dual(layers=2).state_dict())


def _lora_merge(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:  # every matrix, in place: a merged low-rank update
                a, b = torch.randn(p.shape[0], 2), torch.randn(2, p.shape[1])
                p.add_(0.05 * a @ b)


def _sgd_step(model: torch.nn.Module) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = model(torch.randint(0, 100, (2, 8)), torch.randn(2, 3, 16, 16))
    (out.logits_per_image.square().mean() + out.text_embeds.sum()).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    model.eval()


@pytest.mark.parametrize("grad", [torch.no_grad, torch.inference_mode])
def test_a_mixed_winner_answers_on_the_new_weights(alternating_plan: None, grad: Any) -> None:
    torch.manual_seed(0)
    model = dual(layers=2)
    torch._dynamo.reset()
    backend = chain.chain(*BACKENDS, "eager", mode="fastest", regions=True)
    fast = torch.compile(model, backend=backend, dynamic=False)
    _check(fast, model, grad, (8, 12))
    for graph in backend.report.graphs:  # one per length
        assert graph.winner == mix.REGIONS, graph.attempts
        served = {p["backend"] for p in graph.winning_attempt.details["parts"]}
        assert set(BACKENDS) <= served, served
    for update in (_load_other, _lora_merge, _sgd_step):  # each answered on, in turn
        update(model)
        _check(fast, model, grad, (8, 12))
