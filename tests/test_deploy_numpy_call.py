"""The loaded program's call on numpy views (`chain.deploy.numpy_call`), on held-out models
returning transformers `ModelOutput`s (ResNet, CLIP vision, Llama; issue 47).

It must serve plain calls, give what the graph gives (values, the output's type, keys,
attributes, tuple indexing) and what eager gives (within ONNX Runtime's tolerance), at two
shapes, under `no_grad`, `inference_mode` and threads; and leave every call it cannot make
the same to the graph, with the same answer or the same refusal as the graph's.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

import chain
from chain.bench.export_zoo import build
from chain.deploy import InputMismatch, LeanModule, LoadedProgram
from tests.helpers import Seen, count_numpy_runs

pytest.importorskip("transformers")
OP = torch.ops.backend_chain.run_payload.default
# per model, two inputs of different shapes (CLIP's position embeddings fix its image size)
SHAPES = {
    "resnet": ((2, 3, 32, 32), (3, 3, 40, 40)),
    "clip_vision": ((2, 3, 32, 32), (3, 3, 32, 32)),
    "llama": ((2, 8), (3, 5)),
}


def _input(name: str, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randint(0, 100, shape) if name == "llama" else torch.randn(shape)


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts session runs through the numpy entry (`numpy_parts`) in modules built after."""
    calls: list[int] = []
    count_numpy_runs(monkeypatch, calls)
    yield calls


@pytest.fixture(scope="module")
def programs(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[tuple[str, int], tuple[torch.nn.Module, LoadedProgram]]:
    """Each model exported with chain("onnxruntime", "eager"), saved and loaded, per shape."""
    folder = tmp_path_factory.mktemp("numpy_call")
    out: dict[tuple[str, int], tuple[torch.nn.Module, LoadedProgram]] = {}
    for name, shapes in SHAPES.items():
        model, _ = build(name)
        for k, shape in enumerate(shapes):
            backend = chain.chain("onnxruntime", "eager", measure=False)
            result = chain.export(model, (_input(name, shape),), backend=backend)
            path = folder / f"{name}_{k}.pt2"
            torch.export.save(result.program, path)
            out[name, k] = model, chain.load(path)
    return out


def _same_output(got: Any, want: Any, exact: bool) -> None:
    """The same ModelOutput: type, keys in order, attributes, tuple view; equal values
    (`exact`: the same session's, else eager's within ORT's tolerance)."""
    assert type(got) is type(want)
    assert list(got.keys()) == list(want.keys())
    assert list(vars(got)) == list(vars(want))
    assert len(got.to_tuple()) == len(want.to_tuple())
    for k, key in enumerate(want.keys()):
        assert got[k] is got[key] is getattr(got, key)
        if exact:
            assert torch.equal(got[key], want[key]), key
        else:
            torch.testing.assert_close(got[key], want[key], rtol=1e-4, atol=1e-4)
    for key, value in vars(want).items():
        if value is None:
            assert getattr(got, key) is None, key


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_the_numpy_call_serves_and_equals_graph_and_eager(
    programs: dict[tuple[str, int], tuple[torch.nn.Module, LoadedProgram]],
    runs: list[int],
    name: str,
    mode: str,
) -> None:
    context = torch.inference_mode if mode == "inference_mode" else torch.no_grad
    for k, shape in enumerate(SHAPES[name]):
        model, program = programs[name, k]
        module, graph = program.module(), LeanModule(program, direct=False)
        assert module._call.__qualname__ == "numpy_fused.<locals>.call"
        x = _input(name, shape)
        with context():
            before = len(runs)
            got = module(x)
            assert len(runs) == before + 1  # the numpy entry ran the session
            _same_output(got, graph(x), exact=True)
            _same_output(got, model(x), exact=False)
        got.last_hidden_state = got.last_hidden_state + 1  # ModelOutput's own setattr still
        assert got["last_hidden_state"] is got.last_hidden_state  # keeps the item in step


def test_the_numpy_call_under_threads(
    programs: dict[tuple[str, int], tuple[torch.nn.Module, LoadedProgram]], runs: list[int]
) -> None:
    modules = [programs["resnet", k][1].module() for k in (0, 1)]
    graphs = [LeanModule(programs["resnet", k][1], direct=False) for k in (0, 1)]
    inputs = [_input("resnet", shape) for shape in SHAPES["resnet"]]
    with torch.no_grad():
        want = [g(x) for g, x in zip(graphs, inputs, strict=True)]

    def call(k: int) -> bool:
        with torch.inference_mode() if k % 3 else torch.no_grad():
            got = modules[k % 2](inputs[k % 2])
        _same_output(got, want[k % 2], exact=True)
        return True

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(call, range(40)))
    assert len(runs) == 40


class _Functions(TorchFunctionMode):
    """A torch function mode that changes nothing."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def _outcome(call: Any, x: Any) -> str:
    """What a call gave: its error's type and first line, or its output's leaves."""
    try:
        out = call(x)
    except Exception as error:  # compared with the graph's own outcome
        return f"{type(error).__name__}: {str(error).splitlines()[0]}"
    return repr([(k, v.shape) for k, v in out.items()])


def test_calls_the_numpy_path_cannot_make_go_to_the_graph(
    programs: dict[tuple[str, int], tuple[torch.nn.Module, LoadedProgram]], runs: list[int]
) -> None:
    program = programs["resnet", 0][1]
    module, graph = program.module(), LeanModule(program, direct=False)
    x = _input("resnet", SHAPES["resnet"][0])
    with torch.no_grad():
        want = graph(x)
        strided = module(x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2))
        assert len(runs) == 1  # numpy reads strides: still the numpy path
        _same_output(strided, want, exact=True)
        needs_grad = x.clone().requires_grad_()
        _same_output(module(needs_grad), want, exact=True)  # the graph detaches it
        negative = torch._neg_view(-x)  # the negative bit: numpy() refuses it
        _same_output(module(negative), graph(negative), exact=True)
        with Seen() as seen:
            _same_output(module(x), want, exact=True)
        assert OP in seen.ops  # a dispatch mode sees the op: the graph ran
        with _Functions():
            _same_output(module(x), want, exact=True)
        by_name = module(pixel_values=x)
    _same_output(by_name, want, exact=True)
    assert len(runs) == 1  # none of these took the numpy path
    out = module(needs_grad)  # grad mode on: the op's refusal of a gradient, as before
    assert out.last_hidden_state.requires_grad and len(runs) == 1
    with pytest.raises(RuntimeError, match="has no gradient"):
        out.last_hidden_state.sum().backward()
    for wrong in (x.double(), x[:, :, :31], x.unsqueeze(0), x.to(torch.bfloat16), x.to("meta")):
        got = _outcome(module, wrong)
        assert got == _outcome(graph, wrong)
        assert got.startswith(InputMismatch.__name__), got
    batched = torch.stack([x, x + 1])  # a functorch transform: the graph's outcome
    assert _outcome(torch.vmap(module), batched) == _outcome(torch.vmap(graph), batched)
    # not fullgraph: dynamo breaks at the ModelOutput's rebuild (as before this path)
    compiled = torch.compile(lambda t: module(t).pooler_output * 2, backend="eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), want.pooler_output * 2)
    assert len(runs) == 1  # a compile traces the op, not the session


def test_a_dynamic_program_keeps_the_checked_graph_path(tmp_path: Path, runs: list[int]) -> None:
    model, (x,) = build("resnet")
    batch = torch.export.Dim("batch", min=1, max=8)
    result = chain.export(
        model,
        (x,),
        backend=chain.chain("onnxruntime", "eager", measure=False),
        dynamic_shapes={"pixel_values": {0: batch}},
    )
    torch.export.save(result.program, tmp_path / "dynamic.pt2")
    module = chain.load(tmp_path / "dynamic.pt2").module()
    assert module._call.__qualname__ != "numpy_fused.<locals>.call"  # symbolic: full check
    for size in (1, 5):
        y = torch.randn(size, 3, 32, 32)
        with torch.inference_mode():
            _same_output(module(y), model(y), exact=False)
    assert runs == []
    with pytest.raises(InputMismatch, match="outside the range"):
        module(torch.randn(9, 3, 32, 32))
