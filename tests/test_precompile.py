"""torch's precompile with a chain (issue 48): `aot_compile` of a function compiled with a
chain, `save_compiled_function`, and `torch.compiler.load_compiled_function` in a fresh
process that compiles nothing; refusals (eager winner, tampered bytes, another key, other
weights) are one line."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from chain import chain
from chain.deploy.precompile import MAGIC, PrecompileError, deserialize, serialize
from tests.helpers import fresh_process
from tests.models import build, tiny_bert

pytest.importorskip("onnxruntime")
pytest.importorskip("transformers")


def run(model: torch.nn.Module, x: torch.Tensor) -> Any:
    """The function precompiled: the model is an argument, so torch saves no module."""
    return model(x)


def run_tuple(model: torch.nn.Module, x: torch.Tensor) -> Any:
    """A transformers model's outputs as a tuple: a function returning a `ModelOutput` loads
    only with `f_globals` holding dynamo's alias of `collections` (torch's precompile)."""
    return model(x, return_dict=False)


def function_for(make: Callable[[], Any]) -> Callable[..., Any]:
    return run_tuple if make is bert else run


def bert() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model, (ids,) = tiny_bert()
    return model.eval(), ids, torch.randint(0, 100, (3, 11))


def mlp() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    model, (x,) = build("mlp")
    return model, x, torch.randn(7, 32)


# name -> (model builder, grad mode, dynamic): each case saved here, loaded in one process
CASES: dict[str, tuple[Callable[[], Any], str, bool]] = {
    "mlp_no_grad_dynamic": (mlp, "no_grad", True),
    "mlp_inference_mode": (mlp, "inference_mode", False),
    "bert_no_grad": (bert, "no_grad", False),
    "bert_inference_mode_dynamic": (bert, "inference_mode", True),
}


def grad_mode(name: str) -> contextlib.AbstractContextManager[Any]:
    return torch.no_grad() if name == "no_grad" else torch.inference_mode()


def as_made_in(mode: str, x: torch.Tensor) -> torch.Tensor:
    """`x` as a caller in `mode` makes it: under inference_mode an inference tensor (torch's
    guards tell those apart: a function compiled for one refuses the other)."""
    return x.clone() if mode == "inference_mode" else x


def onnxruntime_chain() -> Any:
    """A chain whose winner is ONNX Runtime whatever the machine's load (not timed)."""
    return chain("onnxruntime", "eager", measure=False)


def compiled(name: str) -> tuple[Any, Any, torch.nn.Module, torch.Tensor]:
    """The case's aot_compile'd function, its chain, model and first input."""
    make, mode, dynamic = CASES[name]
    model, x, _ = make()
    backend = onnxruntime_chain()
    # transformers' modules bring guards torch cannot save (ID_MATCH on functions, modules):
    # torch's own filter keeps tensor, shape and grad-mode guards only (torch's docs)
    guards = {"guard_filter_fn": torch.compiler.keep_portable_guards_unsafe}
    options = guards if make is bert else None
    with grad_mode(mode):
        x = as_made_in(mode, x)
        flag: bool | None = dynamic
        if dynamic and make is bert:  # dynamic=True lifts its float constants to graph
            flag = None  # inputs (ONNX Runtime declines those): its ids' sizes are marked
            torch._dynamo.mark_dynamic(x, 0)
            torch._dynamo.mark_dynamic(x, 1)
        fn = torch.compile(
            function_for(make), fullgraph=True, dynamic=flag, backend=backend, options=options
        )
        return fn.aot_compile(((model, x), {})), backend, model, x


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("precompiled")
    for name in CASES:
        fn, backend, _, _ = compiled(name)
        assert backend.report.graphs[0].winner == "onnxruntime", backend.report
        fn.save_compiled_function(str(folder / f"{name}.bin"))
    yield folder


LOAD = """
import json, sys, torch
from chain.select.core import Chain
from tests.test_precompile import CASES, as_made_in, function_for, grad_mode
from torch.utils import _pytree as pytree

def refuse(*args, **kwargs):
    raise AssertionError("compiled in the loading process")

torch.onnx.export = refuse  # ONNX Runtime's compile is this export
Chain.__call__ = refuse  # no selection either
out = {}
for name, (make, mode, dynamic) in CASES.items():
    model, x, other = make()
    # torch's guards capture the grad mode they are built in: load where it will be called
    with open(f"{sys.argv[1]}/{name}.bin", "rb") as f, grad_mode(mode):
        fn = torch.compiler.load_compiled_function(f)
    shapes = [x, other] if dynamic else [x]
    worst = 0.0
    with grad_mode(mode):
        for inputs in shapes:
            inputs = as_made_in(mode, inputs)
            got, want = fn(model, inputs), function_for(make)(model, inputs)
            assert type(got) is type(want), (type(got), type(want))
            for g, w in zip(pytree.tree_leaves(got), pytree.tree_leaves(want), strict=True):
                worst = max(worst, (g - w).abs().max().item())
    runner = fn._artifacts.compiled_fn
    out[name] = {"worst": worst, "calls": len(shapes), "type": type(runner).__name__,
                 "winner": runner.winner}
out["onnxscript"] = "onnxscript" in sys.modules
out["inductor"] = "torch._inductor.compile_fx" in sys.modules
print(json.dumps(out))
"""


def test_precompiled_chain_loads_in_a_fresh_process_without_compiling(saved: Path) -> None:
    got = fresh_process(LOAD, str(saved))
    assert got.pop("onnxscript") is False  # the ONNX exporter was never imported
    assert got.pop("inductor") is False
    for name, (_, _, dynamic) in CASES.items():
        case = got[name]
        assert case["type"] == "Loaded" and case["winner"] == "onnxruntime", (name, case)
        assert case["calls"] == (2 if dynamic else 1)
        assert case["worst"] < 1e-4, (name, case)


def test_an_eager_winner_is_refused_with_one_line(tmp_path: Path) -> None:
    model, x, _ = mlp()
    backend = chain("eager")
    with torch.no_grad():
        fn = torch.compile(run, fullgraph=True, backend=backend).aot_compile(((model, x), {}))
    with pytest.raises(PrecompileError) as caught:
        fn.save_compiled_function(str(tmp_path / "f.bin"))
    message = str(caught.value)
    assert "\n" not in message
    assert "its winner eager cannot be saved" in message, message
    assert not (tmp_path / "f.bin").exists()


@pytest.fixture(scope="module")
def mlp_guard() -> tuple[Any, torch.nn.Module, torch.Tensor]:
    """A chain's compiled graph (onnxruntime won) of the MLP, with its model and input."""
    fn, _, model, x = compiled("mlp_inference_mode")
    return fn._artifacts.compiled_fn, model, x


def test_tampered_bytes_are_refused(mlp_guard: tuple[Any, torch.nn.Module, torch.Tensor]) -> None:
    guard, model, x = mlp_guard
    data = serialize(guard)
    head = data.index(b"\n") + 1
    n_entry = int(data[:head].split()[2])
    pid = data.index(b'"pid": ', head) + len(b'"pid": ')  # the entry's pid: a digit edited
    assert pid < head + n_entry
    refusals = {}
    for where, at in {"entry": pid, "artefact": len(data) - 100}.items():
        bad = bytearray(data)
        bad[at] = ord("9") if bad[at] != ord("9") else ord("8")
        with pytest.raises(PrecompileError) as caught:
            deserialize(bytes(bad))
        refusals[where] = str(caught.value)
    assert "digest does not match" in refusals["entry"], refusals
    assert "artefact bytes do not match their digest" in refusals["artefact"], refusals
    with pytest.raises(PrecompileError, match="sizes do not match"):
        deserialize(data[:-1])
    with pytest.raises(PrecompileError, match="not a backend-chain precompiled graph"):
        deserialize(b"garbage\n" + data)
    with torch.inference_mode():  # the bytes untouched load and answer
        (got,) = deserialize(data)(*_flat(model, x))  # a graph returns a tuple
        torch.testing.assert_close(got, model(x))


def _flat(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """The MLP graph's inputs in dynamo's order: first layer's weights, x, second layer's."""
    first, second = model.net[0], model.net[2]
    return [first.weight, first.bias, x, second.weight, second.bias]


def test_a_signed_graph_loads_only_under_its_key(
    mlp_guard: tuple[Any, torch.nn.Module, torch.Tensor], monkeypatch: pytest.MonkeyPatch
) -> None:
    guard, model, x = mlp_guard
    monkeypatch.setenv("CHAIN_MEMORY_KEY", "fleet key")
    data = serialize(guard)
    with torch.inference_mode():
        (got,) = deserialize(data)(*_flat(model, x))  # a graph returns a tuple
        torch.testing.assert_close(got, model(x))
    monkeypatch.setenv("CHAIN_MEMORY_KEY", "another key")
    with pytest.raises(PrecompileError, match="signature does not match"):
        deserialize(data)
    monkeypatch.delenv("CHAIN_MEMORY_KEY")
    unsigned = serialize(guard)
    monkeypatch.setenv("CHAIN_MEMORY_KEY", "fleet key")
    with pytest.raises(PrecompileError, match="not signed"):
        deserialize(unsigned)


def test_other_weights_are_refused_at_the_first_call(
    mlp_guard: tuple[Any, torch.nn.Module, torch.Tensor],
) -> None:
    guard, _, x = mlp_guard
    loaded = deserialize(serialize(guard))
    torch.manual_seed(1)
    other, _, _ = mlp()
    with torch.no_grad():
        other.net[0].weight.add_(1.0)
    with torch.inference_mode(), pytest.raises(PrecompileError, match="weights passed are not"):
        loaded(*_flat(other, x))


def test_the_bytes_hold_no_pickle(mlp_guard: tuple[Any, torch.nn.Module, torch.Tensor]) -> None:
    """The chain's bytes: a text first line, a JSON entry, an artefact with a JSON header."""
    guard, _, _ = mlp_guard
    data = serialize(guard)
    first, _, rest = data.partition(b"\n")
    _, _, n_entry, _ = first.split()
    assert first.startswith(MAGIC)
    entry = json.loads(rest[: int(n_entry)])
    assert entry["decision"]["winner"] == "onnxruntime"
    assert rest[int(n_entry) :].startswith(b"backend-chain-artefact ")
    assert b"\x80\x04\x95" not in data[:200]  # no pickle protocol header up front


def test_a_tampered_torch_file_is_refused(saved: Path, tmp_path: Path) -> None:
    """torch's file carries the chain's bytes verbatim: a byte changed there is refused at
    `load_compiled_function`, one line."""
    data = bytearray((saved / "mlp_no_grad_dynamic.bin").read_bytes())
    at = data.index(MAGIC)
    first = bytes(data[at : data.index(b"\n", at)]).split()
    end = at + len(b" ".join(first)) + 1 + int(first[2]) + int(first[3])
    data[end - 50] ^= 0x01  # inside the ONNX model
    bad = tmp_path / "bad.bin"
    bad.write_bytes(bytes(data))
    with open(bad, "rb") as f, pytest.raises(PrecompileError) as caught:
        torch.compiler.load_compiled_function(f)
    assert "artefact bytes do not match their digest" in str(caught.value)
    assert "\n" not in str(caught.value)
