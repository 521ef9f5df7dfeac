"""The loaded program's lean call (`chain.deploy.program`): same outputs as torch's
`module()`, and every input torch's check rejects is an `InputMismatch` naming the input."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils import _pytree as pytree

import chain
from chain.deploy import InputMismatch, LeanModule, LoadedProgram
from tests.models import build_extra

BACKEND = ("onnxruntime", "eager")


def _save_load(program: torch.export.ExportedProgram, path: Path) -> LoadedProgram:
    torch.export.save(program, path)
    return chain.load(path)


def _exported(model: torch.nn.Module, args: tuple[Any, ...], path: Path) -> LoadedProgram:
    result = chain.export(model, args, backend=chain.chain(*BACKEND, measure=False))
    return _save_load(result.program, path)


def bert_programs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, int], LoadedProgram]:
    """A tiny transformers BERT exported, saved and loaded at two shapes."""
    model, _ = build_extra("bert")
    folder = tmp_path_factory.mktemp("bert")
    return {
        shape: _exported(model, (torch.randint(0, 100, shape),), folder / f"{shape[1]}.pt2")
        for shape in ((2, 8), (3, 5))
    }


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, int], LoadedProgram]:
    return bert_programs(tmp_path_factory)


class DictInput(torch.nn.Module):
    """Takes a dict of two tensors (a pytree input with keys to check)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 4)

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.relu(self.linear(inputs["a"])) + inputs["b"]


@pytest.fixture(scope="module")
def dict_program(tmp_path_factory: pytest.TempPathFactory) -> LoadedProgram:
    torch.manual_seed(0)
    args = ({"a": torch.randn(2, 8), "b": torch.randn(2, 4)},)
    return _exported(DictInput().eval(), args, tmp_path_factory.mktemp("dict") / "d.pt2")


def test_lean_outputs_equal_torch_module_at_two_shapes_from_threads(
    bert: dict[tuple[int, int], LoadedProgram],
) -> None:
    for shape, program in bert.items():
        lean, old = program.module(), program.module(lean=False)
        assert isinstance(lean, LeanModule) and not isinstance(old, LeanModule)
        inputs = [torch.randint(0, 100, shape) for _ in range(4)]
        with torch.no_grad():
            expected = [old(x) for x in inputs]
            with ThreadPoolExecutor(4) as pool:
                got = list(pool.map(lambda k, f=lean, xs=inputs: f(xs[k % 4]), range(16)))
        for k, out in enumerate(got):
            want = expected[k % 4]
            assert type(out) is type(want)  # the transformers output class
            assert list(out.keys()) == list(want.keys())
            for a, b in zip(pytree.tree_leaves(out), pytree.tree_leaves(want), strict=True):
                assert torch.equal(a, b), (shape, k)


def test_lean_accepts_inputs_by_name_and_dict_keys_in_any_order(
    bert: dict[tuple[int, int], LoadedProgram], dict_program: LoadedProgram
) -> None:
    ids = torch.randint(0, 100, (2, 8))
    program = bert[(2, 8)]
    with torch.no_grad():
        by_name = program.module()(input_ids=ids).last_hidden_state
        assert torch.equal(by_name, program.module(lean=False)(ids).last_hidden_state)
        a, b = torch.randn(2, 8), torch.randn(2, 4)
        got = dict_program.module()({"b": b, "a": a})
        assert torch.equal(got, dict_program.module(lean=False)({"a": a, "b": b}))


@pytest.mark.parametrize(
    ("call", "message"),  # torch's check does not look at dtype and device (ORT or a kernel may)
    [
        (lambda ids: ((ids, ids), {}), "takes 1 inputs \\(input_ids\\), got 2 positional"),
        (lambda ids: ((), {}), "input 'input_ids' is missing"),
        (lambda ids: ((ids,), {"mask": ids}), "input 'mask': not an input of the program"),
        (lambda ids: ((ids,), {"input_ids": ids}), "input 'input_ids': given twice"),
        (lambda ids: (((ids, ids),), {}), "input 'input_ids': expected a tensor, got a tuple"),
        (lambda ids: ((ids.float(),), {}), "'input_ids': expected dtype torch.int64, got"),
        (lambda ids: ((ids.to("meta"),), {}), "'input_ids': expected a tensor on cpu, got one"),
        (lambda ids: ((ids[0],), {}), "'input_ids': expected 2 dimensions \\(2, 8\\), got 1"),
        (lambda ids: ((ids[:, :4],), {}), "'input_ids': size 4 at dimension 1, the program"),
        (lambda ids: ((ids.tolist(),), {}), "'input_ids': expected a tensor, got a list of 2"),
    ],
    ids=[
        "extra",
        "missing",
        "unknown",
        "twice",
        "tuple",
        "dtype",
        "device",
        "rank",
        "size",
        "list",
    ],
)
def test_lean_rejects_a_wrong_input_naming_it(
    bert: dict[tuple[int, int], LoadedProgram], call: Any, message: str
) -> None:
    args, kwargs = call(torch.randint(0, 100, (2, 8)))
    module = bert[(2, 8)].module()
    with pytest.raises(InputMismatch, match=message) as caught:
        module(*args, **kwargs)
    assert "\n" not in str(caught.value)
    if not message.startswith("'input_ids': expected dtype") and "on cpu" not in message:
        with pytest.raises((RuntimeError, ValueError, TypeError, AssertionError)):
            bert[(2, 8)].module(lean=False)(*args, **kwargs)  # torch's check refuses it too


def test_lean_rejects_a_dict_with_other_keys(dict_program: LoadedProgram) -> None:
    module = dict_program.module()
    a, b = torch.randn(2, 8), torch.randn(2, 4)
    with pytest.raises(InputMismatch, match="input 'inputs': expected a dict with keys \\['a', "):
        module({"a": a, "c": b})
    with pytest.raises(InputMismatch, match=r"'inputs': expected a dict .* got a torch.float32"):
        module(a)
    with pytest.raises(InputMismatch, match="input \"inputs\\['b'\\]\": expected dtype"):
        module({"a": a, "b": b.double()})


class TwoInputs(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.sum(-1) + y.sum(-1)


def test_lean_checks_range_constraints_and_equal_sizes(tmp_path: Path) -> None:
    batch = torch.export.Dim("batch", min=2, max=16)
    program = torch.export.export(
        TwoInputs(),
        (torch.randn(4, 3), torch.randn(4, 5)),
        dynamic_shapes=({0: batch}, {0: batch}),
    )
    module = _save_load(program, tmp_path / "dyn.pt2").module()
    assert isinstance(module, LeanModule)
    x, y = torch.randn(7, 3), torch.randn(7, 5)
    assert torch.equal(module(x, y), x.sum(-1) + y.sum(-1))  # any size in range
    with pytest.raises(InputMismatch, match="'x': size 1 at dimension 0 is outside the range 2"):
        module(torch.randn(1, 3), torch.randn(1, 5))
    with pytest.raises(InputMismatch, match="'x': size 17 at dimension 0 is outside"):
        module(torch.randn(17, 3), torch.randn(17, 5))
    with pytest.raises(InputMismatch, match=r"'y': size 6 at dimension 0 must equal .* \(7\)"):
        module(x, torch.randn(6, 5))
    with pytest.raises(InputMismatch, match="'y': size 4 at dimension 1, the program was"):
        module(x, torch.randn(7, 4))


class Counter(torch.nn.Module):
    """Mutates a buffer in place (the program's graph keeps the in-place op)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return x * 2


def test_lean_mutates_buffers_as_torch_module_does(tmp_path: Path) -> None:
    program = _save_load(torch.export.export(Counter(), (torch.randn(2),)), tmp_path / "c.pt2")
    lean, old = program.module(), program.module(lean=False)
    assert isinstance(lean, LeanModule)
    x = torch.randn(2)
    assert torch.equal(lean(x), x * 2)
    lean(x)
    assert program.state_dict["calls"].item() == 2.0  # the program's own buffer, as torch's
    old(x)
    assert old.calls.item() == 3.0


def test_program_the_lean_call_cannot_cover_runs_through_torch_module_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    half = torch.export.Dim("half", min=1, max=8)
    program = torch.export.export(
        TwoInputs(),
        (torch.randn(4, 3), torch.randn(4, 5)),
        dynamic_shapes=({0: 2 * half}, {0: 2 * half}),
    )
    program = _save_load(program, tmp_path / "expr.pt2")
    with caplog.at_level(logging.WARNING, logger="chain.deploy.program"):
        module = program.module()
    assert not isinstance(module, LeanModule)
    assert "a size given by an expression (2*" in caplog.text
    x, y = torch.randn(4, 3), torch.randn(4, 5)
    assert torch.equal(module(x, y), x.sum(-1) + y.sum(-1))


def test_lean_module_is_inference_only(bert: dict[tuple[int, int], LoadedProgram]) -> None:
    module = bert[(2, 8)].module()
    assert module.eval() is module and not module.training
    with pytest.raises(NotImplementedError, match="inference only"):
        module.train()
    with pytest.raises(NotImplementedError, match="cannot be moved or cast"):
        module.to(torch.float64)
