"""A loaded program that is one CPU payload call runs its runner directly (`chain.deploy.direct`).

The direct call must give what the graph gives (values, structure, errors), be taken for
plain inputs only, and leave to the graph every call it cannot make the same: inputs that
need a gradient, strided inputs, dispatch modes, compiles, kwargs, wrong inputs, dynamic
shapes, programs with PyTorch parts.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.export import Dim

import chain
from backends.onnxruntime.deploy import _CpuRun
from chain.bench.export_zoo import build as build_zoo
from chain.deploy import InputMismatch, LeanModule, LoadedProgram
from tests.helpers import Seen, count_numpy_runs
from tests.models import build
from tests.test_deploy_program import bert_programs

BACKEND = ("onnxruntime", "eager")
OP = torch.ops.backend_chain.run_payload.default


def _load(model: torch.nn.Module, args: tuple[Any, ...], path: Path, **options: Any) -> Any:
    result = chain.export(model, args, backend=chain.chain(*BACKEND, measure=False), **options)
    torch.export.save(result.program, path)
    return chain.load(path)


@pytest.fixture
def plain_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts calls of the ORT runner's plain entries (the direct path: `plain`, or the session
    run `numpy_parts` hands out) in modules built after."""
    calls: list[int] = []
    original = _CpuRun.plain

    def counted(self: _CpuRun, args: Any) -> list[torch.Tensor]:
        calls.append(1)
        return original(self, args)

    monkeypatch.setattr(_CpuRun, "plain", counted)
    count_numpy_runs(monkeypatch, calls)  # the same entry, on numpy views (`numpy_call.py`)
    yield calls


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, int], LoadedProgram]:
    return bert_programs(tmp_path_factory)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_direct_call_equals_the_graph_at_two_shapes(
    bert: dict[tuple[int, int], LoadedProgram], plain_calls: list[int], mode: str
) -> None:
    context = torch.inference_mode if mode == "inference_mode" else torch.no_grad
    for shape, program in bert.items():
        direct, graph = program.module(), LeanModule(program, direct=False)
        assert direct._direct is not None and graph._direct is None
        ids = torch.randint(0, 100, shape)
        with context():
            before = len(plain_calls)
            got = direct(ids)
            assert len(plain_calls) == before + 1  # the direct path ran
            want = graph(ids)
            assert len(plain_calls) == before + 1  # the graph did not use it
        assert type(got) is type(want) and got.keys() == want.keys()
        for key in want:
            assert torch.equal(got[key], want[key]), key


def test_direct_call_under_threads(
    bert: dict[tuple[int, int], LoadedProgram], plain_calls: list[int]
) -> None:
    modules = {shape: program.module() for shape, program in bert.items()}
    inputs = {shape: torch.randint(0, 100, shape) for shape in modules}
    graphs = {shape: LeanModule(bert[shape], direct=False) for shape in modules}
    with torch.no_grad():
        want = {s: graphs[s](inputs[s]).last_hidden_state for s in modules}

    def call(k: int) -> bool:
        shape = list(modules)[k % 2]
        with torch.inference_mode():
            return torch.equal(modules[shape](inputs[shape]).last_hidden_state, want[shape])

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(call, range(40)))
    assert len(plain_calls) == 40


def test_calls_the_direct_path_cannot_make_go_to_the_graph(
    bert: dict[tuple[int, int], LoadedProgram], plain_calls: list[int]
) -> None:
    program = bert[(2, 8)]
    module, graph = program.module(), LeanModule(program, direct=False)
    ids = torch.randint(0, 100, (2, 8))
    with torch.no_grad():
        want = graph(ids).last_hidden_state
        by_name = module(input_ids=ids).last_hidden_state  # bound, checked, then direct
        strided = torch.randint(0, 100, (8, 2)).t()  # ORT reads numpy's strides
        strided_got = module(strided).last_hidden_state
        strided_want = graph(strided.contiguous()).last_hidden_state
        assert plain_calls == [1, 1]
        with Seen() as seen:  # a dispatch mode must see the op: the graph
            moded = module(ids).last_hidden_state
    assert OP in seen.ops
    assert torch.equal(by_name, want) and torch.equal(moded, want)
    assert torch.equal(strided_got, strided_want)
    assert plain_calls == [1, 1]
    with pytest.raises(InputMismatch, match=r"expected dtype torch\.int64"):
        module(ids.int())
    with pytest.raises(InputMismatch, match="size 9 at dimension 1"):
        module(torch.randint(0, 100, (2, 9)))


def test_an_input_that_needs_a_gradient_gets_the_ops_refusal(
    tmp_path: Path, plain_calls: list[int]
) -> None:
    model, args = build("mlp")
    module = _load(model, args, tmp_path / "mlp.pt2").module()
    x = args[0].clone().requires_grad_()
    out = module(x)
    assert out.requires_grad and plain_calls == []
    with pytest.raises(RuntimeError, match="has no gradient"):
        out.sum().backward()
    with torch.no_grad():
        torch.testing.assert_close(module(x), model(x))  # the graph detaches it
    assert plain_calls == []


def test_a_compile_traces_the_op_not_the_session(tmp_path: Path, plain_calls: list[int]) -> None:
    model, args = build("mlp")
    module = _load(model, args, tmp_path / "mlp.pt2").module()
    compiled = torch.compile(lambda x: module(x) * 2, backend="eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(args[0]), model(args[0]) * 2)
    assert plain_calls == []


class _Views(torch.nn.Module):
    """Outputs that are views of the input in eager (a reshape) beside a computed one."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.reshape(-1), self.linear(x)


def test_outputs_never_share_memory_with_inputs(tmp_path: Path, plain_calls: list[int]) -> None:
    model, x = _Views().eval(), torch.randn(2, 8)
    module = _load(model, (x,), tmp_path / "views.pt2").module()
    with torch.no_grad():
        flat, linear = module(x)
    assert plain_calls == [1] or module._direct is None
    torch.testing.assert_close(flat, x.reshape(-1))
    torch.testing.assert_close(linear, model.linear(x), rtol=1e-5, atol=1e-6)
    assert flat.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    x.add_(1)  # a later write to the input does not reach an output
    torch.testing.assert_close(flat + 1, x.reshape(-1))
    row = torch.randn(1, 8).expand(2, 8)  # a zero stride: ORT reads numpy's strides
    with torch.no_grad():
        flat, linear = module(row)
    torch.testing.assert_close(flat, row.reshape(-1))
    torch.testing.assert_close(linear, model.linear(row), rtol=1e-5, atol=1e-6)


def test_programs_with_pytorch_parts_or_dynamic_shapes(
    tmp_path: Path, plain_calls: list[int]
) -> None:
    model, _ = build_zoo("distilbert")
    dims = {"input_ids": {0: Dim("batch", min=1, max=32), 1: Dim("length", min=2, max=64)}}
    ids = torch.randint(0, 100, (16, 8))
    split = _load(model, (ids,), tmp_path / "split.pt2", torch_executed_ops=("aten.gelu",))
    assert split.module()._direct is None  # PyTorch keeps gelu: the graph runs
    dynamic = _load(model, (ids,), tmp_path / "dynamic.pt2", dynamic_shapes=dims).module()
    assert dynamic._direct is not None
    for batch, length in ((1, 8), (4, 12), (16, 5)):
        ids = torch.randint(0, 100, (batch, length))
        with torch.inference_mode():
            want = model(ids).last_hidden_state
            got = dynamic(ids).last_hidden_state
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert len(plain_calls) == 3
    with pytest.raises(InputMismatch, match="outside the range"):
        dynamic(torch.randint(0, 100, (33, 8)))
