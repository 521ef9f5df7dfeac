"""The loaded program's call path after issue 47's cuts: its `ModelOutput`s built without
the constructor (static and dynamic shapes, threads) act as torch's `module()` outputs, and
the one-frame direct call still checks what it checked before: the runner's outputs
against the program's declaration, and inputs numpy cannot read right (a negative-bit
view, a gradient, another device) going to the graph."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.export import Dim

import chain
from backends.onnxruntime.deploy import _CpuRun
from chain.bench.export_zoo import build as build_zoo
from chain.deploy import InputMismatch, LeanModule, LoadedProgram, PayloadMismatch
from tests.models import build
from tests.test_deploy_direct import plain_calls  # noqa: F401 (a fixture)
from tests.test_deploy_program import bert_programs
from tests.test_deploy_rebuild import behaves_alike

transformers = pytest.importorskip("transformers")
BACKEND = ("onnxruntime", "eager")


def _load(model: torch.nn.Module, args: tuple[Any, ...], path: Path, **options: Any) -> Any:
    result = chain.export(model, args, backend=chain.chain(*BACKEND, measure=False), **options)
    torch.export.save(result.program, path)
    return chain.load(path)


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, int], LoadedProgram]:
    return bert_programs(tmp_path_factory)


def _no_constructor(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: Any) -> None:
        raise AssertionError("ModelOutput's constructor ran at call time")

    monkeypatch.setattr(transformers.utils.ModelOutput, "__post_init__", refuse)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_loaded_model_outputs_act_as_torch_modules_from_threads(
    bert: dict[tuple[int, int], LoadedProgram], mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    context = torch.inference_mode if mode == "inference_mode" else torch.no_grad
    for shape, program in bert.items():
        lean, old = program.module(), program.module(lean=False)
        inputs = [torch.randint(0, 100, shape) for _ in range(4)]
        with context():
            want = [old(x) for x in inputs]

        def call(k: int, f: Any = lean, xs: list[torch.Tensor] = inputs) -> Any:
            with context():  # grad modes are per thread
                return f(xs[k % 4])

        _no_constructor(monkeypatch)
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(call, range(16)))
        monkeypatch.undo()
        for k, out in enumerate(got):
            expected = want[k % 4]
            for key in expected:
                assert torch.equal(out[key], expected[key]), (shape, k, key)
                out[key] = expected[key]  # the same tensors: the rest compares by identity
            behaves_alike(out, expected)


def test_a_dynamic_program_builds_its_outputs_without_the_constructor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, _ = build_zoo("distilbert")
    dims = {"input_ids": {0: Dim("batch", min=1, max=32), 1: Dim("length", min=2, max=64)}}
    ids = torch.randint(0, 100, (16, 8))
    module = _load(model, (ids,), tmp_path / "dynamic.pt2", dynamic_shapes=dims).module()
    graph = LeanModule(chain.load(tmp_path / "dynamic.pt2"), direct=False)
    for batch, length in ((1, 8), (4, 12)):
        ids = torch.randint(0, 100, (batch, length))
        with torch.inference_mode():
            want = model(ids)
            _no_constructor(monkeypatch)
            got, through_graph = module(ids), graph(ids)
            monkeypatch.undo()
        for out in (got, through_graph):
            torch.testing.assert_close(
                out.last_hidden_state, want.last_hidden_state, rtol=1e-4, atol=1e-5
            )
            out["last_hidden_state"] = want.last_hidden_state
            behaves_alike(out, want)


@pytest.fixture
def mlp(tmp_path: Path) -> tuple[torch.nn.Module, torch.Tensor, LoadedProgram]:
    model, args = build("mlp")
    return model, args[0], _load(model, args, tmp_path / "mlp.pt2")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r[:1], r"output 0 is \(1, 32\) float32, its program declares \(4, 32\)"),
        (lambda r: r.double(), r"output 0 is \(4, 32\) float64, its program declares"),
    ],
    ids=["shape", "dtype"],
)
def test_the_direct_call_refuses_outputs_its_program_does_not_declare(
    mlp: tuple[torch.nn.Module, torch.Tensor, LoadedProgram],
    monkeypatch: pytest.MonkeyPatch,
    change: Any,
    message: str,
) -> None:
    _, x, program = mlp
    original = _CpuRun.plain

    def damaged(self: _CpuRun, args: Any) -> list[torch.Tensor]:
        return [change(r) for r in original(self, args)]

    original_parts = _CpuRun.numpy_parts

    def damaged_parts(self: _CpuRun) -> tuple[Any, list[str], tuple[str, ...]]:
        run, names, feeds = original_parts(self)  # the numpy-view call's session run

        def damaged_run(*run_args: Any) -> list[Any]:
            return [change(torch.from_numpy(o)).numpy() for o in run(*run_args)]

        return damaged_run, names, feeds

    monkeypatch.setattr(_CpuRun, "plain", damaged)
    monkeypatch.setattr(_CpuRun, "numpy_parts", damaged_parts)
    module = program.module()
    assert module._direct is not None
    with torch.no_grad():
        with pytest.raises(PayloadMismatch, match=message):
            module(x)  # the one-frame call
        with pytest.raises(PayloadMismatch, match=message):
            module(x=x)  # bound by name, checked, then the runner
        with pytest.raises(PayloadMismatch, match=message):
            module._direct([x])  # the direct call on checked inputs


def test_inputs_numpy_cannot_read_right_go_to_the_graph(
    mlp: tuple[torch.nn.Module, torch.Tensor, LoadedProgram],
    plain_calls: list[int],  # noqa: F811 (the fixture imported above)
) -> None:
    model, x, program = mlp
    calls = plain_calls
    module = program.module()
    negative = torch._neg_view(x)  # a lazy negative bit: numpy would read x itself
    assert negative.is_neg()
    strided = torch.randn(32, 4).t()
    with torch.no_grad():
        torch.testing.assert_close(module(negative), model(-x), rtol=1e-5, atol=1e-6)
        assert calls == []
        torch.testing.assert_close(module(strided), model(strided), rtol=1e-5, atol=1e-6)
        assert calls == [1]  # ORT reads a strided numpy view right
    graded = module(x.clone().requires_grad_())
    assert graded.requires_grad and calls == [1]  # the op's refusal of a gradient
    with pytest.raises(InputMismatch, match="'x': expected a tensor on cpu, got one on meta"):
        module(x.to("meta"))
    with pytest.raises(InputMismatch, match=r"'x': expected dtype torch\.float32"):
        module(x.double())
    with pytest.raises(InputMismatch, match="'x': size 5 at dimension 0"):
        module(torch.randn(5, 32))
    assert calls == [1]
