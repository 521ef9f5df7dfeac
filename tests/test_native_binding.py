"""A signed AOTInductor package is bound to its program (issue 44, items 1 and 6): the
signature covers the part, the program id its node names, the input and output specs
(shapes, dtypes, strides), the package digest and the machine. A package moved into
another program (the payload, its sha256 and sizes edited in model.json, as a careful
attacker would) is refused, same shapes or not; declared outputs edited are refused at
load, and a payload whose answers differ from its declaration at its call."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import chain
from backends.common.payload import (
    PayloadError,
    digest,
    pack,
    tensor_bytes,
    to_tensor,
    unpack,
)
from backends.inductor.deploy import KEY_ENV

KEY = "the test's program key"
pytestmark = pytest.mark.slow  # three AOTInductor builds (minutes on a busy 2-core CPU)
_OP = torch.ops.backend_chain.run_payload.default


class Act(torch.nn.Module):
    """A linear layer and an activation: programs of the same shapes and other code."""

    def __init__(self, width: int, act: str, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.linear = torch.nn.Linear(width, width)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        return torch.relu(y) if self.act == "relu" else torch.sigmoid(y)


def _export(width: int, act: str, seed: int, backends: tuple[str, ...]) -> Any:
    model = Act(width, act, seed).eval()
    x = torch.randn(2, width)
    result = chain.export(model, (x,), backend=chain.chain(*backends, measure=False))
    assert [p["backend"] for p in result.parts] == [backends[0]], result.notes
    return result.program, model, x


@pytest.fixture(scope="module")
def programs() -> dict[str, Any]:
    """Three signed inductor programs: A (relu, 4 wide), B (sigmoid, 4 wide), C (relu, 64)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(KEY_ENV, KEY)
        return {
            name: _export(width, act, seed, ("inductor", "eager"))
            for name, (width, act, seed) in {
                "A": (4, "relu", 0),
                "B": (4, "sigmoid", 1),
                "C": (64, "relu", 2),
            }.items()
        }


def _node(program: torch.export.ExportedProgram) -> Any:
    return next(n for n in program.graph.nodes if n.target is _OP)


def _payload_of(program: torch.export.ExportedProgram) -> tuple[str, Any, bytes]:
    """The payload's constant name, its placeholder and its bytes."""
    placeholder = _node(program).args[1]
    spec = next(s for s in program.graph_signature.input_specs if s.arg.name == placeholder.name)
    return spec.target, placeholder, bytes(tensor_bytes(program.constants[spec.target]))


def _edited(
    program: torch.export.ExportedProgram,
    path: Path,
    payload: bytes | None = None,
    outputs: list[dict[str, Any]] | None = None,
    program_id: str | None = None,
) -> Path:
    """`program` saved at `path` after the edits an attacker makes in the archive: another
    payload (its sha256 and sizes edited to match), declared outputs, the program id."""
    program = torch.export.load(_save(program, path))  # a copy to edit
    node = _node(program)
    inputs, placeholder, text = node.args
    data = json.loads(text)
    if payload is not None:
        target, placeholder, _ = _payload_of(program)
        tensor = to_tensor(payload)
        program.constants[target] = tensor
        with FakeTensorMode() as fake:
            placeholder.meta["val"] = fake.from_tensor(tensor)
        data["sha256"] = digest(payload)
    if outputs is not None:
        data["outputs"] = outputs
    if program_id is not None:
        data["program"] = program_id
    node.args = (inputs, placeholder, json.dumps(data))
    return _save(program, path)


def _save(program: torch.export.ExportedProgram, path: Path) -> Path:
    torch.export.save(program, path)
    return path


def _answer(path: Path, x: torch.Tensor) -> Any:
    """What `chain.load(path)` answers for `x`, or the refusal's text."""
    chain.deploy.clear_cache()
    try:
        with torch.no_grad():
            return chain.load(path).module()(x)
    except PayloadError as error:
        return str(error)


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)


def test_the_programs_load_and_answer_as_exported(
    programs: dict[str, Any], tmp_path: Path, key: None
) -> None:
    for name, (program, model, x) in programs.items():
        got = _answer(_save(program, tmp_path / f"{name}.pt2"), x)
        assert isinstance(got, torch.Tensor), got
        torch.testing.assert_close(got, model(x).detach(), rtol=1e-4, atol=1e-5)


def test_a_package_moved_into_a_program_of_the_same_shapes_is_refused(
    programs: dict[str, Any], tmp_path: Path, key: None
) -> None:
    _, _, a_payload = _payload_of(programs["A"][0])
    program_b, _, x = programs["B"]
    got = _answer(_edited(program_b, tmp_path / "b.pt2", payload=a_payload), x)
    assert isinstance(got, str) and "moved between programs" in got, got


def test_a_package_moved_into_a_program_of_other_shapes_is_refused(
    programs: dict[str, Any], tmp_path: Path, key: None
) -> None:
    # C's package reads (2, 64) inputs: in A's (2, 4) program it would read past them.
    # A thorough attacker edits the declared outputs and the program id too: the signed
    # input specs still refuse it.
    program_c = programs["C"][0]
    _, _, c_payload = _payload_of(program_c)
    c_said = json.loads(_node(program_c).args[2])
    program_a, _, x = programs["A"]
    got = _answer(_edited(program_a, tmp_path / "a.pt2", payload=c_payload), x)
    assert isinstance(got, str) and "refused" in got, got
    edited = _edited(
        program_a,
        tmp_path / "a2.pt2",
        payload=c_payload,
        outputs=c_said["outputs"],
        program_id=c_said["program"],
    )
    got = _answer(edited, x)
    assert isinstance(got, str) and "signed binding" in got and "(2, 64)" not in got, got
    assert "[2, 64]" in got and "[2, 4]" in got, got


def test_declared_outputs_edited_are_refused(
    programs: dict[str, Any], tmp_path: Path, key: None
) -> None:
    program_a, _, x = programs["A"]
    wide = [{"shape": [2, 100000], "dtype": "float32"}]
    got = _answer(_edited(program_a, tmp_path / "a.pt2", outputs=wide), x)
    assert isinstance(got, str) and "refused" in got and "100000" in got, got


@pytest.fixture(scope="module")
def ort_program() -> Any:
    return _export(4, "relu", 3, ("onnxruntime", "eager"))


def test_declared_outputs_of_an_onnx_payload_edited_are_refused_at_load(
    ort_program: Any, tmp_path: Path
) -> None:
    program, _, x = ort_program
    wide = [{"shape": [2, 100000], "dtype": "float32"}]
    got = _answer(_edited(program, tmp_path / "p.pt2", outputs=wide), x)
    assert isinstance(got, str) and "refused" in got and "100000" in got, got


def test_a_payload_that_answers_other_than_declared_is_refused_at_its_call(
    ort_program: Any, tmp_path: Path
) -> None:
    # header and node edited alike (sha256 fixed): the load's checks agree, the call's not
    program, _, x = ort_program
    header, body = unpack(_payload_of(program)[2])
    wide = [{"shape": [2, 100000], "dtype": "float32"}]
    from backends.common.payload import TensorSpec

    lying = pack(
        type(header)(**{**header.__dict__, "outputs": (TensorSpec((2, 100000), "float32"),)}),
        bytes(body),
    )
    path = _edited(program, tmp_path / "p.pt2", payload=lying, outputs=wide)
    for x_in in (x, torch._neg_view(x)):  # the direct call; a negative view: the graph
        got = _answer(path, x_in)
        assert isinstance(got, str) and "refused" in got and "100000" in got, got


def test_a_negative_view_takes_the_graph_and_answers_as_torch(
    ort_program: Any, tmp_path: Path
) -> None:
    program, model, x = ort_program
    module = chain.load(_save(program, tmp_path / "p.pt2")).module()
    view = torch._neg_view(x)  # the negative bit set: numpy cannot read it
    assert view.is_neg()
    with torch.no_grad():
        torch.testing.assert_close(module(view), model(view), rtol=1e-4, atol=1e-5)
