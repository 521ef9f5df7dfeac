"""The loaded program's output rebuild (issue 47): a closure prepared once per output spec
gives what `pytree.tree_unflatten` gives (types, keys, the same tensors) for transformers
models' `ModelOutput`s (DistilBERT, BERT, GPT-2 from small configs), without walking the
spec at each call."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils import _pytree as pytree

from chain.deploy.program import _unflattener
from chain.deploy.rebuild import rebuilder

transformers = pytest.importorskip("transformers")


def distilbert() -> tuple[torch.nn.Module, dict[str, Any]]:
    config = transformers.DistilBertConfig(
        vocab_size=100, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=64
    )
    return transformers.DistilBertModel(config), {}


def bert() -> tuple[torch.nn.Module, dict[str, Any]]:
    config = transformers.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    return transformers.BertForSequenceClassification(config), {"output_hidden_states": True}


def gpt2() -> tuple[torch.nn.Module, dict[str, Any]]:
    config = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    return transformers.GPT2LMHeadModel(config), {"use_cache": False, "output_attentions": True}


MODELS: dict[str, Callable[[], tuple[torch.nn.Module, dict[str, Any]]]] = {
    "distilbert": distilbert,
    "bert": bert,
    "gpt2": gpt2,
}


def same(a: Any, b: Any, where: str = "out") -> None:
    """`a` and `b` have the same types and keys all the way down, and the same leaves."""
    assert type(a) is type(b), (where, type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a is b, where
        return
    if isinstance(a, dict):  # ModelOutput is an OrderedDict: its keys, in order
        assert list(a.keys()) == list(b.keys()), where
        for k in a:
            same(a[k], b[k], f"{where}.{k}")
        return
    if isinstance(a, tuple | list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{where}[{i}]")
        return
    assert a == b, where


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("grad", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("shape", [(2, 8), (3, 13)])
def test_rebuilt_outputs_equal_tree_unflatten(
    name: str, grad: str, shape: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    model, kwargs = MODELS[name]()
    mode = torch.no_grad() if grad == "no_grad" else torch.inference_mode()
    with mode:
        out = model.eval()(torch.randint(0, 100, shape), **kwargs)
    assert isinstance(out, transformers.utils.ModelOutput)
    flat, spec = pytree.tree_flatten(out)
    want = pytree.tree_unflatten(flat, spec)
    build = rebuilder(spec)
    program_path = _unflattener(spec)  # what LeanModule uses for this spec
    walked = pytree.tree_unflatten

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the spec was walked at call time")

    monkeypatch.setattr(pytree, "tree_unflatten", refuse)
    for got in (build(flat), program_path(flat), build(tuple(flat))):
        same(got, want)
    monkeypatch.setattr(pytree, "tree_unflatten", walked)


def test_a_builder_reads_every_leaf_once() -> None:
    spec = pytree.tree_structure({"a": (1, [2, 3]), "b": None, "c": 4})
    flat = [torch.tensor(i) for i in range(spec.num_leaves)]
    same(rebuilder(spec)(flat), pytree.tree_unflatten(flat, spec))


def behaves_alike(got: Any, want: Any, pickled: bool = True) -> None:
    """A rebuilt `ModelOutput` acts as the constructor's: attributes (None ones too), items
    by key and index, tuple form, equality, repr and a pickle round trip."""
    same(got, want)
    assert list(vars(got)) == list(vars(want))
    for name, value in vars(want).items():
        same(getattr(got, name), value, name)
    same(got.to_tuple(), want.to_tuple())
    same(got[0], want[0])
    key = next(iter(want))
    same(got[key], want[key])
    assert repr(got) == repr(want)
    if pickled:
        assert list(pickle.loads(pickle.dumps(got)).keys()) == list(want.keys())


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("grad", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("shape", [(2, 8), (3, 13)])
def test_model_outputs_are_built_without_their_constructor(
    name: str, grad: str, shape: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prepared rebuild gives the constructor's object without running
    `ModelOutput.__post_init__` (~50 us warm, ~0.1 ms after an idle gap: issue 47)."""
    torch.manual_seed(0)
    model, kwargs = MODELS[name]()
    mode = torch.no_grad() if grad == "no_grad" else torch.inference_mode()
    with mode:
        out = model.eval()(torch.randint(0, 100, shape), **kwargs)
    flat, spec = pytree.tree_flatten(out)
    want = pytree.tree_unflatten(flat, spec)
    build = _unflattener(spec)  # prepared at load: it may run the constructor once
    base = transformers.utils.ModelOutput

    def refuse(self: Any) -> None:
        raise AssertionError("ModelOutput's constructor ran at call time")

    monkeypatch.setattr(base, "__post_init__", refuse)
    with mode:
        got = build(flat)
    monkeypatch.undo()
    behaves_alike(got, want)


def test_a_first_field_alone_that_is_no_tensor_takes_the_constructor() -> None:
    """transformers unpacks a lone non-tensor first field as (key, value) pairs: the
    rebuild keeps the constructor's answer for it (and builds a tensor one directly)."""
    from transformers.modeling_outputs import BaseModelOutput

    tensor = torch.ones(2)
    for value in (tensor, (("hidden_states", (tensor,)),), [tensor, tensor]):
        out = BaseModelOutput(last_hidden_state=value)
        flat, spec = pytree.tree_flatten(out)
        build = rebuilder(spec)
        want = pytree.tree_unflatten(flat, spec)
        got = build(flat)
        behaves_alike(got, want)


def test_an_overridden_class_keeps_its_constructor() -> None:
    """A `ModelOutput` subclass with its own `__post_init__` is built by its constructor."""
    from dataclasses import dataclass

    seen: list[int] = []

    @dataclass
    class Scaled(transformers.utils.ModelOutput):
        logits: torch.Tensor | None = None
        extra: torch.Tensor | None = None

        def __post_init__(self) -> None:
            seen.append(1)
            super().__post_init__()

    out = Scaled(logits=torch.ones(2), extra=torch.zeros(1))
    flat, spec = pytree.tree_flatten(out)
    build = rebuilder(spec)
    seen.clear()
    got = build(flat)
    assert seen == [1]
    behaves_alike(got, pytree.tree_unflatten(flat, spec), pickled=False)  # a local class
