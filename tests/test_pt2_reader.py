"""The strict `.pt2` reader of `chain.load` (issue 32): a fuzz over archive mutations.

Two real programs are made with `chain.export` (one with PyTorch weights, one with an ONNX
Runtime payload constant), then their zips are mutated deterministically: config keys,
shapes and types, path prefixes (`opaque_obj_`, `custom_obj_`, sub-folders), entry names,
extra and missing entries, the model's JSON (call targets, guards, custom objects), sample
inputs. Every mutated archive is either loaded and gives the same outputs, or refused
with one-line `PayloadError`; no mutation ever reaches an unpickler (a marker file that
a pickle would create never appears).
"""

from __future__ import annotations

import copy
import json
import pickle
import random
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import chain
from backends.common.payload import PayloadError

Entries = list[tuple[str, bytes]]
Mutation = Callable[[Entries, random.Random], Entries]
SEED, ROUNDS = 32, 160  # per program
pytestmark = pytest.mark.filterwarnings("ignore:Duplicate name")  # a mutation on purpose


class Model(torch.nn.Module):
    """Weights, a persistent buffer and a lifted constant: every folder of the archive."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 4)
        self.register_buffer("shift", torch.arange(4.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x)) + self.shift + torch.tensor([1.0, 2.0, 3.0, 4.0])


class Pickled:
    """Unpickling this creates the marker file: proof that a route reached pickle."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, torch.Tensor]]:
    """Each program saved, with the input and the output it must give once loaded."""
    folder = tmp_path_factory.mktemp("pt2")
    torch.manual_seed(0)
    model, x = Model().eval(), torch.randn(2, 8)
    made = {}
    for name, backends in (("weights", ("eager",)), ("payload", ("onnxruntime", "eager"))):
        result = chain.export(model, (x,), backend=chain.chain(*backends, measure=False))
        torch.export.save(result.program, folder / f"{name}.pt2")
        made[name] = folder / f"{name}.pt2"
    with torch.no_grad():
        expected = model(x)
    return {name: (path, expected) for name, path in made.items()} | {"x": (folder, x)}


def _entries(path: Path) -> Entries:
    with zipfile.ZipFile(path) as archive:
        return [(info.filename, archive.read(info.filename)) for info in archive.infolist()]


def _write(entries: Entries, path: Path) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for name, data in entries:
            archive.writestr(name, data)
    return path


def _root(entries: Entries) -> str:
    return entries[0][0].split("/", 1)[0]


def _edit_json(entries: Entries, suffix: str, edit: Callable[[Any], Any]) -> Entries:
    """`entries` with the JSON entry ending in `suffix` replaced by `edit` of it."""
    out = []
    for name, data in entries:
        if name.endswith(suffix):
            data = json.dumps(edit(json.loads(data))).encode()
        out.append((name, data))
    return out


def _config_of(entries: Entries, rng: random.Random) -> str:
    """The suffix of a config that has entries (the weights' or the constants')."""
    full = [
        n.split("/", 1)[1]
        for n, d in entries
        if n.endswith("config.json") and json.loads(d)["config"]
    ]
    return rng.choice(full)


def _entry_meta(config: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    return config["config"][rng.choice(sorted(config["config"]))]


HOSTILE_VALUES: tuple[Any, ...] = (None, True, 0, -1, 1.5, "", "x", [], {}, [1], {"a": 1})
PATH_NAMES = (
    "opaque_obj_0", "custom_obj_0", "opaque_obj_0/x", "custom_obj_1/tensor_0", "sub/tensor_0",
    "sub/weight_0", "../weights/weight_0", "tensor_0/", "weight_9", "tensor_01", " tensor_0",
    "tensor_0\n", "TENSOR_0", "weight_0.pt", "model.pt", "opaque_obj_", "tensor_-1",
)  # fmt: skip
ENTRY_NAMES = (
    "extra/module_info.json", "data/weights/model.pt", "data/constants/model.pt",
    "data/aotinductor/model/model.so", "data/constants/opaque_obj_0",
    "data/constants/custom_obj_0", "data/constants/sub/opaque_obj_0", "version",
    "data/sample_inputs/other.pt", "models/other.json", "data/weights/weight_0/x",
    "data/mtia/x", "xl_model_weights/model_param_config", "data/weights/",
)  # fmt: skip
TARGETS = (
    "torch.serialization.os.system", "builtins.eval", "torch.load", "torch._C._pickle_load_obj",
    "_operator.attrgetter", "math.__dict__", "#custom:op", "torch.ops.higher_order.print",
    "torch.ops.foo.bar.default", "torch.ops.aten.add.Tensor.__call__", 7, None,
    "torch.ops.aten.from_file.default", "torch.ops.aten.save.default",
)  # fmt: skip
GUARDS = (
    "__import__('os').system('true')", "L['x'].size()[0] == 2 # x", "L['x'].__class__",
    "open('m', 'w')", "(lambda: 1)()", "L['x'].size()[0] == 2\nimport os", 3,
    "L['x'].size()[0] >= 0",  # a real guard's shape: allowed
)  # fmt: skip


def mutate_config_shape(entries: Entries, rng: random.Random) -> Entries:
    """The config object itself: a list, nested, extra or missing top-level keys."""
    suffix = _config_of(entries, rng)
    shapes: list[Callable[[Any], Any]] = [
        lambda c: [c],
        lambda c: c["config"] and list(c["config"].values()),
        lambda c: {"config": c},
        lambda c: {**c, "extra": 1},
        lambda c: {},
        lambda c: {"config": rng.choice(HOSTILE_VALUES)},
        lambda c: {"config": {k: [v] for k, v in c["config"].items()}},
        lambda c: {"config": dict(reversed(list(c["config"].items())))},
    ]
    return _edit_json(entries, suffix, rng.choice(shapes))


def mutate_entry_meta(entries: Entries, rng: random.Random) -> Entries:
    """One payload entry: a key added, removed, renamed, or given a hostile value."""
    suffix = _config_of(entries, rng)

    def edit(config: dict[str, Any]) -> dict[str, Any]:
        meta = _entry_meta(config, rng)
        key = rng.choice(sorted(meta))
        action = rng.randrange(4)
        if action == 0:
            del meta[key]
        elif action == 1:
            meta[key + "_"] = meta.pop(key)
        elif action == 2:
            meta["extra"] = rng.choice(HOSTILE_VALUES)
        else:
            meta[key] = rng.choice(HOSTILE_VALUES)
        return config

    return _edit_json(entries, suffix, edit)


def mutate_tensor_meta(entries: Entries, rng: random.Random) -> Entries:
    """One field of one entry's tensor description."""
    suffix = _config_of(entries, rng)

    def edit(config: dict[str, Any]) -> dict[str, Any]:
        meta = _entry_meta(config, rng)["tensor_meta"]
        key = rng.choice(sorted(meta))
        meta[key] = rng.choice(
            (*HOSTILE_VALUES, 6, 3, [{"as_int": 1}], [{"as_expr": "s0"}], {"as_int": 1})
        )
        return config

    return _edit_json(entries, suffix, edit)


def mutate_path_name(entries: Entries, rng: random.Random, marker: Path) -> Entries:
    """A path name of another kind (pickled prefixes, sub-folders, traversal) whose entry
    holds a pickle that would create the marker, with `use_pickle` still false."""
    suffix = _config_of(entries, rng)
    folder = suffix.rsplit("/", 1)[0]
    path_name = rng.choice(PATH_NAMES)
    blob = pickle.dumps(Pickled(marker))

    def edit(config: dict[str, Any]) -> dict[str, Any]:
        meta = _entry_meta(config, rng)
        meta["path_name"] = path_name
        meta["tensor_meta"]["dtype"] = 1  # uint8: any size is whole elements
        meta["tensor_meta"]["sizes"] = [{"as_int": len(blob)}]
        meta["tensor_meta"]["strides"] = [{"as_int": 1}]
        return config

    return [*_edit_json(entries, suffix, edit), (f"{_root(entries)}/{folder}/{path_name}", blob)]


def mutate_entry_name(entries: Entries, rng: random.Random, marker: Path) -> Entries:
    """An entry renamed, removed, duplicated, moved out of the root, or an extra entry
    (legacy weights, AOTInductor, extra files) holding a pickle."""
    root, out = _root(entries), list(entries)
    at = rng.randrange(len(out))
    name, data = out[at]
    action = rng.randrange(6)
    if action == 0:
        out.append((f"{root}/{rng.choice(ENTRY_NAMES)}", pickle.dumps(Pickled(marker))))
    elif action == 1:
        del out[at]
    elif action == 2:
        out.append((name, data))
    elif action == 3:
        out[at] = (rng.choice(("", "other/", f"{root}/sub/", "../")) + name, data)
    elif action == 4:
        out[at] = (name.upper() if rng.random() < 0.5 else name + ".bak", data)
    else:
        rng.shuffle(out)  # order alone: loads
    return out


def mutate_model(entries: Entries, rng: random.Random) -> Entries:
    """The model's JSON: call targets, guards, custom objects, input kinds, extra keys."""

    def edit(model: dict[str, Any]) -> dict[str, Any]:
        graph_module = model["graph_module"]
        action = rng.randrange(6)
        if action == 0:
            rng.choice(graph_module["graph"]["nodes"])["target"] = rng.choice(TARGETS)
        elif action == 1:
            model["guards_code"] = [rng.choice(GUARDS)]
        elif action == 2:
            graph_module["graph"]["custom_obj_values"] = {"obj": {"name": "obj", "class_fqn": "x"}}
        elif action == 3:
            spec = graph_module["signature"]["input_specs"][0]
            [(kind, body)] = spec.items()
            spec.clear()
            spec[rng.choice(("custom_obj", "token", kind))] = body
        elif action == 4:
            key = rng.choice(("extra", "guards_code", "torch_version"))
            model[key] = rng.choice(HOSTILE_VALUES)
        else:
            node = rng.choice(graph_module["graph"]["nodes"])
            node["inputs"].append({"name": "o", "arg": {"as_custom_obj": {"name": "o"}}, "kind": 1})
        return model

    return _edit_json(entries, "/models/model.json", edit)


def mutate_fixed(entries: Entries, rng: random.Random, marker: Path) -> Entries:
    """archive_format, archive_version or the sample inputs given other contents."""
    target = rng.choice(("archive_format", "archive_version", "data/sample_inputs/model.pt"))
    value = rng.choice(
        (b"", b"1", b"pt3", b"\x00" * 8, pickle.dumps(Pickled(marker)), pickle.dumps([1]))
    )
    return [(n, value if n.endswith("/" + target) else d) for n, d in entries]


def _mutations(marker: Path) -> list[Mutation]:
    return [
        mutate_config_shape,
        mutate_entry_meta,
        mutate_tensor_meta,
        lambda e, r: mutate_path_name(e, r, marker),
        lambda e, r: mutate_entry_name(e, r, marker),
        mutate_model,
        lambda e, r: mutate_fixed(e, r, marker),
    ]


def _outcome(path: Path, x: torch.Tensor, expected: torch.Tensor) -> str:
    """Whether `path` is refused (one-line PayloadError) or loaded (same outputs)."""
    try:
        program = chain.load(path)
    except PayloadError as error:
        assert "\n" not in str(error) and str(error).startswith(str(path)), str(error)
        return "refused"
    with torch.no_grad():
        got = program.module()(x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    return "loaded"


@pytest.mark.parametrize("which", ["weights", "payload"])
def test_every_mutation_loads_the_same_program_or_is_refused(
    which: str, programs: dict[str, tuple[Path, torch.Tensor]], tmp_path: Path
) -> None:
    source, expected = programs[which]
    x = programs["x"][1]
    assert _outcome(source, x, expected) == "loaded"
    marker = tmp_path / "unpickled"
    mutations = _mutations(marker)
    rng = random.Random(f"{SEED}-{which}")
    outcomes: dict[str, int] = {"loaded": 0, "refused": 0}
    for i in range(ROUNDS):
        mutate = mutations[i % len(mutations)]
        entries = mutate(copy.deepcopy(_entries(source)), rng)
        path = _write(entries, tmp_path / f"m{i}.pt2")
        outcomes[_outcome(path, x, expected)] += 1
        assert not marker.exists(), f"mutation {i} ({mutate}) reached an unpickler"
        path.unlink()
    assert outcomes["refused"] > ROUNDS // 2 and outcomes["loaded"] > 0, outcomes


def _opaque_archive(source: Path, marker: Path, target: Path) -> Path:
    """The known hole: a constants entry `opaque_obj_0/x` (a sub-folder), `use_pickle`
    false, plus that zip entry holding a pickle. Torch picks pickle.loads from the prefix."""
    blob = pickle.dumps(Pickled(marker))
    meta = {
        "path_name": "opaque_obj_0/x", "is_param": False, "use_pickle": False,
        "tensor_meta": {
            "dtype": 1, "sizes": [{"as_int": len(blob)}], "requires_grad": False,
            "device": {"type": "cpu", "index": None}, "strides": [{"as_int": 1}],
            "storage_offset": {"as_int": 0}, "layout": 7,
        },
    }  # fmt: skip
    entries = _entries(source)
    entries = _edit_json(
        entries,
        "/data/constants/model_constants_config.json",
        lambda c: {"config": {**c["config"], "evil": meta}},
    )
    return _write([*entries, (f"{_root(entries)}/data/constants/opaque_obj_0/x", blob)], target)


def test_opaque_object_in_a_sub_folder_is_refused_before_torch_reads_it(
    programs: dict[str, tuple[Path, torch.Tensor]], tmp_path: Path
) -> None:
    source, _ = programs["weights"]
    marker = tmp_path / "unpickled"
    crafted = _opaque_archive(source, marker, tmp_path / "crafted.pt2")
    with pytest.raises(PayloadError, match="refused, not loaded") as info:
        chain.load(crafted)
    assert "opaque_obj_0/x" in str(info.value) and "\n" not in str(info.value)
    assert not marker.exists()
    # the proof that the refusal matters: torch's own loader unpickles it
    with pytest.raises(Exception):  # noqa: B017 - whatever torch raises after unpickling
        torch.export.load(crafted)
        raise RuntimeError("torch.export.load read the crafted archive")
    assert marker.exists()


@pytest.mark.parametrize("config", [[], [{"config": {}}], "config", 3, None])
def test_config_that_is_not_an_object_is_a_payload_error(
    config: Any, programs: dict[str, tuple[Path, torch.Tensor]], tmp_path: Path
) -> None:
    source, _ = programs["payload"]
    entries = _edit_json(_entries(source), "/model_constants_config.json", lambda _: config)
    with pytest.raises(PayloadError, match=r"model_constants_config\.json is not a"):
        chain.load(_write(entries, tmp_path / "list.pt2"))


def test_pickled_tensor_and_code_in_guards_are_refused(
    programs: dict[str, tuple[Path, torch.Tensor]], tmp_path: Path
) -> None:
    source, _ = programs["weights"]

    def pickled(config: dict[str, Any]) -> dict[str, Any]:
        next(iter(config["config"].values()))["use_pickle"] = True
        return config

    entries = _edit_json(_entries(source), "/model_weights_config.json", pickled)
    with pytest.raises(PayloadError, match=r"is pickled \(use_pickle\)"):
        chain.load(_write(entries, tmp_path / "pickled.pt2"))
    guard = "__import__('os').getcwd() == 1"
    entries = _edit_json(
        _entries(source), "/models/model.json", lambda m: {**m, "guards_code": [guard]}
    )
    with pytest.raises(PayloadError, match="a guard that is not size arithmetic"):
        chain.load(_write(entries, tmp_path / "guard.pt2"))


def test_a_fifo_or_a_folder_is_refused_without_blocking(tmp_path: Path) -> None:
    import os

    os.mkfifo(tmp_path / "fifo.pt2")
    with pytest.raises(PayloadError, match="not a regular file"):
        chain.load(tmp_path / "fifo.pt2")
    with pytest.raises(PayloadError, match="not a regular file"):
        chain.load(tmp_path)


class Halves(torch.nn.Module):
    """A graph with symbolic sizes: its model JSON holds sympy expressions."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[: x.shape[0] // 2] * 2


def test_size_expression_that_runs_code_is_refused(tmp_path: Path) -> None:
    """Torch reads each size expression with sympy.sympify, which evals it."""
    dim = {"x": {0: torch.export.Dim.AUTO}}
    program = torch.export.export(Halves(), (torch.randn(6, 3),), dynamic_shapes=dim)
    torch.export.save(program, tmp_path / "dynamic.pt2")
    x = torch.randn(8, 3)
    assert _outcome(tmp_path / "dynamic.pt2", x, x[:4] * 2) == "loaded"
    marker = tmp_path / "evaluated"
    evil = f"__import__('pathlib').Path('{marker}').touch() or Symbol('s0', integer=True)"

    def edit(model: dict[str, Any]) -> dict[str, Any]:
        values = model["graph_module"]["graph"]["tensor_values"]
        sized = next(v for v in values.values() if "as_expr" in v["sizes"][0])
        sized["sizes"][0]["as_expr"]["expr_str"] = evil
        return model

    crafted = _write(
        _edit_json(_entries(tmp_path / "dynamic.pt2"), "/models/model.json", edit),
        tmp_path / "crafted.pt2",
    )
    with pytest.raises(PayloadError, match="a size expression that is not sympy arithmetic"):
        chain.load(crafted)
    assert not marker.exists()
    with pytest.raises(Exception):  # noqa: B017 - whatever torch raises after the eval
        torch.export.load(crafted)
        raise RuntimeError("torch.export.load read the crafted archive")
    assert marker.exists()  # the proof: torch's own loader ran it
