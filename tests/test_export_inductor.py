"""inductor exported as a signed AOTInductor package (`backends.inductor.deploy`).

A package is native code: exported only under CHAIN_PROGRAM_KEY, loaded only in a process
that holds the same key (checked before the package is opened), else the chain exports the
next candidate and says why. A tiny transformers BERT, loaded in fresh processes.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.export import Dim

import chain
from backends.common.payload import PayloadError
from backends.inductor.deploy import KEY_ENV
from tests.helpers import ROOT, fresh_process
from tests.models import build, build_extra

BACKEND = ("inductor", "onnxruntime", "eager")
KEY = "a key the test made up"

LOAD = """
import json, sys
import torch
import chain
from backends.common.payload import PayloadError
path, ids = sys.argv[1], torch.load(sys.argv[2])
try:
    module = chain.load(path).module()
except PayloadError as error:
    print(json.dumps({"refused": str(error)}))
    raise SystemExit(0)
with torch.inference_mode():
    out = module(ids).last_hidden_state
torch.save(out, sys.argv[3])
print(json.dumps({"refused": None}))
"""


def _chain() -> Any:
    return chain.chain(*BACKEND, measure=False)


def _env(key: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    env["PYTHONPATH"] = str(ROOT)
    if key is not None:
        env[KEY_ENV] = key
    return env


@pytest.fixture(scope="module")
def bert_program(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Any]:
    """A tiny BERT exported with inductor winning, under the key: (path, ids, result)."""
    folder = tmp_path_factory.mktemp("aoti")
    model, _ = build_extra("bert")
    ids = torch.randint(0, 100, (2, 8))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(KEY_ENV, KEY)
        result = chain.export(model, (ids,), backend=_chain())
    torch.export.save(result.program, folder / "bert.pt2")
    torch.save(ids, folder / "ids.pt")
    with torch.no_grad():
        torch.save(model(ids).last_hidden_state, folder / "eager.pt")
    return folder / "bert.pt2", folder, result


def test_an_inductor_winner_exports_its_signed_package(
    bert_program: tuple[Path, Path, Any],
) -> None:
    path, folder, result = bert_program
    assert [p["backend"] for p in result.parts] == ["inductor"]
    assert any("AOTInductor package, signed" in n for n in result.notes)
    got = fresh_process(
        LOAD, str(path), str(folder / "ids.pt"), str(folder / "out.pt"), env=_env(KEY)
    )
    assert got == {"refused": None}
    eager = torch.load(folder / "eager.pt")
    torch.testing.assert_close(torch.load(folder / "out.pt"), eager, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("key", [None, "another key"], ids=["no key", "another key"])
def test_a_package_is_not_loaded_without_its_key(
    bert_program: tuple[Path, Path, Any], key: str | None
) -> None:
    path, folder, _ = bert_program
    got = fresh_process(
        LOAD, str(path), str(folder / "ids.pt"), str(folder / "x.pt"), env=_env(key)
    )
    assert got["refused"] is not None and KEY_ENV in got["refused"]
    assert ("not signed with" in got["refused"]) == (key is not None)
    assert not (folder / "x.pt").exists()


def test_torch_loader_refuses_it_too(
    bert_program: tuple[Path, Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch.export.load does not check payloads: the op's first run does, with the key
    path, folder, _ = bert_program
    monkeypatch.delenv(KEY_ENV, raising=False)
    chain.deploy.clear_cache()
    module = torch.export.load(path).module()
    with pytest.raises(PayloadError, match=KEY_ENV), torch.no_grad():
        module(torch.load(folder / "ids.pt"))


def test_without_a_key_the_next_candidate_is_exported_and_the_note_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    model, args = build("mlp")
    result = chain.export(model, args, backend=_chain())
    assert [p["backend"] for p in result.parts] == ["onnxruntime"]
    note = next(n for n in result.notes if n.startswith("export:"))
    assert "inductor not exported: its AOTInductor package is native code" in note
    assert KEY_ENV in note


def test_dynamic_shapes_export_onnx_runtime_even_with_a_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    model, args = build("mlp")
    dims = {"x": {0: Dim("batch", max=64)}}
    result = chain.export(model, args, backend=_chain(), dynamic_shapes=dims)
    assert [p["backend"] for p in result.parts] == ["onnxruntime"]
    assert any("inductor not exported: dynamic shapes" in n for n in result.notes)


def test_the_loaded_package_answers_from_threads(
    bert_program: tuple[Path, Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _, _ = bert_program
    monkeypatch.setenv(KEY_ENV, KEY)
    module = chain.load(path).module()
    model, _ = build_extra("bert")
    inputs = [torch.randint(0, 100, (2, 8)) for _ in range(4)]
    with torch.no_grad():
        want = [model(x).last_hidden_state for x in inputs]

    def call(k: int) -> float:
        with torch.inference_mode() if k % 2 else torch.no_grad():
            got = module(inputs[k % 4]).last_hidden_state
        return (got - want[k % 4]).abs().max().item()

    with ThreadPoolExecutor(4) as pool:
        errors = list(pool.map(call, range(32)))
    assert max(errors) < 1e-4, errors
