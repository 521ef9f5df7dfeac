"""Deploy anywhere (issue 36): programs that load without the model's code, export the best
backend that can export, and take dynamic shapes.

- Swin and DistilBERT programs (tiny configs, random weights) load and run in a fresh
  process where importing transformers fails: their outputs come as stand-ins with the
  same fields and values, with one `StandInWarning` per load; likewise a program whose
  input and output are a class of this module (called there with a plain dict).
- With `chain("inductor", "onnxruntime", "eager")` inductor wins and cannot export: the
  program carries ONNX Runtime parts, and the notes say so.
- A `dynamic_shapes` export runs at three batch sizes and two lengths, as eager does.
"""

from __future__ import annotations

import json
import re
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.export import Dim
from torch.utils import _pytree as pytree

import chain
from backends.common.payload import PayloadError, SizeOf, TensorSpec
from chain.bench.export_zoo import build
from chain.deploy import InputMismatch, StandIn, StandInWarning
from chain.deploy.exporter import _instead, export_order
from chain.report.records import Attempt, GraphRecord, Status
from tests.helpers import fresh_process
from tests.models import MLP

pytest.importorskip("transformers")


class Pair(dict):  # type: ignore[type-arg]
    """An input and output class of this module, which the serving process never imports."""


PAIR = f"{__name__}.Pair"
pytree.register_pytree_node(
    Pair,
    lambda p: (list(p.values()), list(p.keys())),
    lambda values, keys: Pair(zip(keys, values, strict=True)),
    serialized_type_name=PAIR,
    flatten_with_keys_fn=lambda p: ([(pytree.MappingKey(k), v) for k, v in p.items()], list(p)),
)


class PairModel(torch.nn.Module):
    """Takes a Pair, returns a Pair."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, pair: Pair) -> Pair:
        return Pair(a=self.linear(pair["a"]), b=pair["a"] + pair["b"])


def _pair() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    return PairModel().eval(), (Pair(a=torch.randn(2, 4), b=torch.randn(2, 4)),)


RECORDED = {
    "swin": "transformers.models.swin.modeling_swin.SwinModelOutput",
    "distilbert": "transformers.modeling_outputs.BaseModelOutput",
    "pair": PAIR,  # its input too: the serving process passes a plain dict
}
FRESH = """
import json, sys, warnings
import torch


class NoTransformers:
    '''Importing transformers fails here: a serving process without the model's code.'''

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "transformers":
            raise ImportError(f"{name} is not installed in this serving process")
        return None


sys.meta_path.insert(0, NoTransformers())
import chain
from chain.deploy import StandIn, StandInWarning

folder, facts = sys.argv[1], {}
for name in sys.argv[2:]:
    args = torch.load(f"{folder}/{name}.in", weights_only=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = chain.load(f"{folder}/{name}.pt2")
    with torch.no_grad():
        out = program.module()(*args)
    torch.save(dict(out.items()), f"{folder}/{name}.out")
    first = next(iter(out))
    facts[name] = {
        "warnings": [str(w.message) for w in caught if w.category is StandInWarning],
        "class": type(out).__name__,
        "stand_in": isinstance(out, StandIn),
        "recorded": getattr(type(out), "recorded", ""),
        "keys": list(out.keys()),
        "access": all(getattr(out, k) is out[k] for k in out) and out[0] is out[first],
    }
facts["imported"] = sorted(m for m in sys.modules if m.split(".")[0] == "transformers")
print(json.dumps(facts))
"""


def _export_ort(name: str) -> tuple[chain.ExportResult, torch.nn.Module, tuple[Any, ...]]:
    model, args = _pair() if name == "pair" else build(name)
    backend = chain.chain("onnxruntime", "eager", measure=False)
    return chain.export(model, args, backend=backend), model, args


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Swin and DistilBERT saved here, loaded and run in one fresh process; eager's outputs."""
    folder = tmp_path_factory.mktemp("anywhere")
    expected, notes = {}, {}
    for name in RECORDED:
        result, model, args = _export_ort(name)
        notes[name] = result.notes
        torch.export.save(result.program, folder / f"{name}.pt2")
        torch.save(
            tuple(dict(a) if isinstance(a, Pair) else a for a in args), folder / f"{name}.in"
        )
        with torch.no_grad():
            expected[name] = dict(model(*args).items())
    facts = fresh_process(FRESH, str(folder), *RECORDED)
    return {"folder": folder, "facts": facts, "expected": expected, "notes": notes}


def test_custom_input_class_is_not_pickled_in_the_program(served: dict[str, Any]) -> None:
    assert any("sample inputs not saved" in n for n in served["notes"]["pair"])


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_program_runs_where_the_model_package_is_not_importable(
    name: str, served: dict[str, Any]
) -> None:
    facts = served["facts"]
    assert facts["imported"] == []  # nothing of transformers was imported there
    fact = facts[name]
    assert fact["stand_in"] and fact["recorded"] == RECORDED[name]
    assert fact["class"] == RECORDED[name].rsplit(".", 1)[-1]
    assert fact["access"]  # by attribute, by key and by position
    [warning] = fact["warnings"]
    assert RECORDED[name] in warning and "stand-ins with the same fields" in warning
    expected = served["expected"][name]
    actual = torch.load(served["folder"] / f"{name}.out", weights_only=True)
    assert fact["keys"] == list(expected) == list(actual)
    for key, want in expected.items():
        torch.testing.assert_close(actual[key], want, rtol=1e-4, atol=1e-5)


def test_the_class_itself_where_its_module_is_imported(served: dict[str, Any]) -> None:
    from transformers.models.swin.modeling_swin import SwinModelOutput

    with warnings.catch_warnings():
        warnings.simplefilter("error", StandInWarning)
        program = chain.load(served["folder"] / "swin.pt2")
    args = torch.load(served["folder"] / "swin.in", weights_only=True)
    with torch.no_grad():
        out = program.module()(*args)
    assert type(out) is SwinModelOutput
    expected = served["expected"]["swin"]
    torch.testing.assert_close(out.last_hidden_state, expected["last_hidden_state"])


def _rewrite_out_spec(source: Path, target: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of the program whose output spec (every occurrence) `edit` changed."""

    def walk(data: Any) -> Any:
        if isinstance(data, dict):
            for key, value in data.items():
                if key == "out_spec" and isinstance(value, str):
                    spec = json.loads(value)
                    edit(spec[1])
                    data[key] = json.dumps(spec)
                else:
                    walk(value)
        elif isinstance(data, list):
            for value in data:
                walk(value)
        return data

    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as new:
        for info in old.infolist():
            data = old.read(info.filename)
            if info.filename.endswith("models/model.json"):
                data = json.dumps(walk(json.loads(data))).encode()
            new.writestr(info.filename, data)
    return target


def _unnamed(spec: dict[str, Any]) -> None:
    spec["type"], spec["context"] = "nowhere.Thing", json.dumps({"not": "fields"})


def _enum_key(spec: dict[str, Any]) -> None:
    enum = {"__enum__": True, "fqn": "nowhere_at_all:Colour", "name": "RED"}
    spec["type"], spec["context"] = "builtins.dict", json.dumps([enum, "b"])


def _bad_name(spec: dict[str, Any]) -> None:
    spec["type"] = "os.system('x')"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_unnamed, "nowhere.Thing, not registered in this process and not recorded by field"),
        (_enum_key, "an enum key whose module is not imported"),
        (_bad_name, "not registered in this process"),
    ],
)
def test_structures_that_cannot_stand_in_are_refused_in_one_line(
    served: dict[str, Any], tmp_path: Path, edit: Callable[[dict[str, Any]], None], message: str
) -> None:
    path = _rewrite_out_spec(served["folder"] / "distilbert.pt2", tmp_path / "x.pt2", edit)
    with pytest.raises(PayloadError, match=message) as error:
        chain.load(path)
    assert "\n" not in str(error.value)


def test_stand_in_reads_like_a_model_output() -> None:
    cls = chain.deploy.structure.stand_in("tests.anywhere.Pair")
    pair = cls([("a", 1), ("b", 2)])
    assert isinstance(pair, StandIn) and pair.a == 1 and pair["b"] == 2 and pair[1] == 2
    assert pair.to_tuple() == (1, 2) and dict(pair) == {"a": 1, "b": 2}
    with pytest.raises(AttributeError, match=r"stand-in for tests\.anywhere\.Pair"):
        _ = pair.c
    leaves, spec = torch.utils._pytree.tree_flatten(pair)
    assert leaves == [1, 2] and torch.utils._pytree.tree_unflatten(leaves, spec) == pair


def test_inductor_winner_exports_onnxruntime_parts(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, x = MLP().eval(), torch.randn(4, 32)
    backend = chain.chain("inductor", "onnxruntime", "eager", eager_floor=False)
    result = chain.export(model, (x,), backend=backend)
    record = result.report.graphs[0]
    assert record.winner == "inductor"
    assert [p["backend"] for p in result.parts] == ["onnxruntime"]
    assert result.notes[0].startswith("inductor won; exported onnxruntime")
    if record.eager_ms is not None:  # the chain timed: the part is timed at export too
        timed = r"onnxruntime, \d+\.\dx \(the chain did not try it: timed at export\)"
        assert re.search(timed, result.notes[0]), result.notes[0]
    assert result.notes[0] in record.notes
    torch.export.save(result.program, tmp_path / "mlp.pt2")
    with torch.no_grad():
        torch.testing.assert_close(chain.load(tmp_path / "mlp.pt2").module()(x), model(x))


def _record(winner: str, *attempts: Attempt) -> GraphRecord:
    return GraphRecord(0, "f", "o", 1, {}, [], attempts, winner)


def test_export_order_takes_the_fastest_passed_exporter_not_one_slower_than_eager() -> None:
    won = Attempt("inductor", Status.WON, latency_ms=0.3, speedup=4.0)
    ort = Attempt("onnxruntime", Status.SLOWER, latency_ms=0.4, speedup=3.0, verdict="faster")
    order = export_order(_record("inductor", won, ort))  # inductor: a signed package, if keyed
    assert [a.backend for a in order] == ["inductor", "onnxruntime"]
    graph = torch.fx.symbolic_trace(MLP())  # not timed: the attempt carries its speedup
    note = _instead(_record("inductor", won, ort), ort, graph, graph, (torch.randn(2, 32),))
    assert note == "inductor won; exported onnxruntime, 3.0x"
    slow = Attempt("onnxruntime", Status.SLOWER, latency_ms=2.0, speedup=0.5, verdict="slower")
    assert export_order(_record("inductor", won, slow)) == [won]
    # eager won: the program stays PyTorch by choice, unless ORT declined (parts of) it
    untried = Attempt("onnxruntime", Status.NOT_TRIED)
    assert export_order(_record("eager", Attempt("eager", Status.WON), untried)) == []
    declined = Attempt("onnxruntime", Status.UNSUPPORTED, reason="an op")
    assert export_order(_record("eager", Attempt("eager", Status.WON), declined)) == [declined]


@pytest.fixture(scope="module")
def distilbert() -> tuple[torch.nn.Module, dict[str, Any]]:
    model, _ = build("distilbert")
    dims = {"input_ids": {0: Dim("batch", min=1, max=32), 1: Dim("length", min=2, max=64)}}
    return model, dims


@pytest.mark.parametrize("split", [False, True], ids=["whole", "parts"])
def test_dynamic_shapes_export_runs_at_other_batches_and_lengths(
    distilbert: tuple[torch.nn.Module, dict[str, Any]], split: bool, tmp_path: Path
) -> None:
    model, dims = distilbert
    kept = ("aten.gelu",) if split else ()  # ORT parts around what PyTorch keeps
    result = chain.export(
        model,
        (torch.randint(0, 100, (16, 8)),),
        backend=chain.chain("onnxruntime", "eager", measure=False),
        dynamic_shapes=dims,
        torch_executed_ops=kept,
    )
    assert result.parts and all(p["backend"] == "onnxruntime" for p in result.parts)
    assert len(result.parts) > 1 if split else "dynamic axes" in result.notes[0]
    torch.export.save(result.program, tmp_path / "dynamic.pt2")
    module = chain.load(tmp_path / "dynamic.pt2").module()
    for batch in (1, 4, 16):
        for length in (8, 12):
            ids = torch.randint(0, 100, (batch, length))
            with torch.no_grad():
                want, got = model(ids).last_hidden_state, module(ids).last_hidden_state
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    with pytest.raises(InputMismatch, match="outside the range"):
        module(torch.randint(0, 100, (33, 8)))


def test_dynamic_output_sizes_are_read_as_data() -> None:
    spec = TensorSpec((SizeOf(2, ((0, 0), (0, 1))), 32), "float32")
    assert TensorSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    assert spec.sizes([torch.empty(3, 5)]) == [30, 32] and not spec.static
    for hostile in ({"c": 1, "of": [["x", 0]]}, {"c": "1", "of": []}, {"c": 1}, [1, 2]):
        with pytest.raises(PayloadError, match="unreadable dynamic output size"):
            SizeOf.from_json(hostile)
