"""A hostile decision store (issue 32): entries with fields of the wrong type, artefacts
that read external data files, Redis servers and URLs that misbehave, bad environment
values and terminal escapes in stored text. Each is refused with a warning or a one-line
error, and the model's answer stays right (a cold start)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from backends.errors import InvalidOption, Unsupported
from chain import chain
from chain.memory import Decision, MemoryWarning, StoreUnavailable
from chain.memory.entry import BadEntry, decode, encode
from chain.memory.stores import LocalStore, RedisStore
from chain.memory.tools import entries, main
from chain.report.records import Attempt, Status
from tests.models import MLP

KEY = "ab" * 16


def _run(backend: Any, seed: int = 0) -> Any:
    """A small MLP compiled afresh through `backend`, its output checked against eager (a
    wrong answer fails here); returns the graph's record."""
    torch._dynamo.reset()
    torch.manual_seed(seed)
    model, x = MLP().eval(), torch.randn(4, 32)
    with torch.no_grad():
        out = torch.compile(model, backend=backend, dynamic=False)(x)
        torch.testing.assert_close(out, model(x))
    return backend.report.graphs[-1]


def _remembered(record: Any) -> bool:
    return any(n.startswith("remembered:") for n in record.notes)


def _rewrite(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Edit a stored entry and fix its digest, as a writer with store access would."""
    entry = json.loads(path.read_bytes())
    change(entry)
    body = {k: entry[k] for k in ("format", "key", "parts", "decision")}
    raw = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    entry["digest"] = hashlib.sha256(raw).hexdigest()
    path.write_text(json.dumps(entry))


def _set(*where: str | int, value: Any) -> Callable[[dict[str, Any]], None]:
    """A change that puts `value` at the path `where` in an entry."""

    def change(entry: dict[str, Any]) -> None:
        target: Any = entry
        for step in where[:-1]:
            target = target[step]
        target[where[-1]] = value

    return change


# -- entries: every field's type checked ------------------------------------------------


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        pytest.param(_set("parts", value=[1, 2]), "parts should be an object", id="parts-list"),
        pytest.param(
            _set("decision", "eager_ms", value="fast"), "eager_ms should be a number", id="eager"
        ),
        pytest.param(
            _set("decision", "eager_ms", value=-1.0), "eager_ms should be finite", id="eager-neg"
        ),
        pytest.param(_set("decision", "host", value=["h"]), "host should be a string", id="host"),
        pytest.param(_set("decision", "pid", value="12"), "pid should be an integer", id="pid"),
        pytest.param(
            _set("decision", "extra", "origin", value={"x": 1}), "extra.origin", id="origin"
        ),
        pytest.param(
            _set("decision", "extra", "eager_errors", value=["small"]),
            "eager_errors\\[0\\]",
            id="eager-errors",
        ),
        pytest.param(
            _set("decision", "attempts", 0, "latency_ms", value="slow"),
            "latency_ms should be a number",
            id="attempt-latency",
        ),
        pytest.param(_set("decision", "attempts", value={}), "attempts should be a list", id="at"),
        pytest.param(_set("decision", "winner", value=7), "winner should be a string", id="win"),
    ],
)
def test_an_entry_with_a_field_of_the_wrong_type_is_a_warning_and_a_cold_start(
    tmp_path: Path,
    change: Callable[[dict[str, Any]], None],
    refusal: str,
) -> None:
    """`parts` as a list raised BackendCompilerFailed; `eager_ms: "fast"` loaded, then
    every report format raised and the live report was never written."""
    _run(chain("eager", store=tmp_path / "store", memory=True))
    [path] = (tmp_path / "store").glob("*.json")
    _rewrite(path, change)
    report = tmp_path / "run.json"
    backend = chain("eager", store=tmp_path / "store", memory=True, report_path=report)
    with pytest.warns(MemoryWarning, match=refusal):
        record = _run(backend)
    assert not _remembered(record)
    assert record.winner == "eager"
    assert any(refusal.replace("\\", "") in n for n in record.notes), record.notes
    assert isinstance(record.eager_ms, float)  # measured now, not the stored text
    assert json.loads(report.read_text())["graphs"][0]["winner"] == "eager"  # written
    decision, _ = decode(path.read_bytes(), path.stem)  # replaced by a valid entry
    assert decision.winner == "eager"


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"[" * 100_000 + b"]" * 100_000, id="nested-deep"),
        pytest.param(b'{"format": 1, "n": ' + b"9" * 5000 + b"}", id="long-number"),
        pytest.param(b'{"a": "\x80"}', id="not-utf8"),
    ],
)
def test_unparseable_entry_bytes_are_a_warning_and_a_cold_start(
    tmp_path: Path, data: bytes
) -> None:
    """JSON the parser gives up on by RecursionError or a too-long integer is BadEntry too."""
    _run(chain("eager", store=tmp_path, memory=True))
    [path] = tmp_path.glob("*.json")
    path.write_bytes(data)
    with pytest.warns(MemoryWarning, match="ignored: not JSON"):
        record = _run(chain("eager", store=tmp_path, memory=True))
    assert not _remembered(record) and record.winner == "eager"


def test_a_digest_or_signature_that_is_not_ascii_is_a_bad_entry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """hmac.compare_digest raises TypeError on non-ASCII text: such a value simply fails."""
    entry = json.loads(encode(KEY, {}, Decision("eager", (Attempt("eager", Status.WON),))))
    with pytest.raises(BadEntry, match="digest does not match"):
        decode(json.dumps({**entry, "digest": "\u00e9" * 64}).encode(), KEY)
    monkeypatch.setenv("CHAIN_MEMORY_KEY", "fleet-secret")
    with pytest.raises(BadEntry, match="signature does not match"):
        decode(json.dumps({**entry, "signature": "\u00e9" * 64}).encode(), KEY)


def test_an_entry_nested_too_deep_for_the_report_writers_is_refused(tmp_path: Path) -> None:
    """Parseable, digested, 500 levels deep in an attempt's details: the report's writers
    recurse through it inside dynamo's frames; refused before it gets there."""
    _run(chain("eager", store=tmp_path, memory=True))
    [path] = tmp_path.glob("*.json")
    deep: Any = 1
    for _ in range(500):
        deep = {"d": deep}
    _rewrite(path, _set("decision", "attempts", 0, "details", value=deep))
    with pytest.warns(MemoryWarning, match="nested deeper than 64 levels"):
        record = _run(chain("eager", store=tmp_path, memory=True))
    assert not _remembered(record) and record.winner == "eager"


# -- artefacts: no external data ----------------------------------------------------------


def _onnx_model(where: str) -> bytes:
    """A tiny ONNX model (y = x + c) whose constant `c` lives in a file `c.bin`: as an
    initializer, or as the tensor attribute of a Constant node."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    c = helper.make_tensor("c", TensorProto.FLOAT, [2], [0.0, 0.0])
    c.ClearField("float_data")
    c.data_location = TensorProto.EXTERNAL
    c.external_data.add(key="location", value="c.bin")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    add = helper.make_node("Add", ["x", "c"], ["y"])
    if where == "initializer":
        graph = helper.make_graph([add], "g", [x], [y], initializer=[c])
    else:
        const = helper.make_node("Constant", [], ["c"], value=c)
        graph = helper.make_graph([const, add], "g", [x], [y])
    return onnx.helper.make_model(graph).SerializeToString()


@pytest.mark.parametrize("where", ["initializer", "attribute"])
def test_an_onnx_artefact_with_external_data_is_refused_before_a_session(where: str) -> None:
    from backends.common.onnx_export import OnnxGraph
    from backends.onnxruntime.artefact import from_artefact, to_artefact

    graph = OnnxGraph(
        model=_onnx_model(where),
        input_names=("x",),
        output_names=("y",),
        input_positions=(0,),
        frozen=(),
        derived=(),
        scalars={},
        dynamic_dims={},
        opset=18,
        num_initializers=1,
    )
    with pytest.raises(Unsupported, match=r"reads 1 tensor\(s\) from external data files"):
        from_artefact(to_artefact(graph).data)


def test_a_stored_artefact_with_external_data_is_a_note_and_an_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A validly digested artefact whose model points a weight at a file in the current
    directory (zeros there): refused before ONNX Runtime reads it, exported again."""
    pytest.importorskip("onnxruntime")
    import numpy as np
    import onnx
    from onnx import numpy_helper

    import backends.onnxruntime as ort_backend
    from backends.onnxruntime.artefact import from_artefact, to_artefact
    from chain.memory import artefacts

    exports: list[int] = []
    real = ort_backend.export_onnx
    monkeypatch.setattr(
        ort_backend, "export_onnx", lambda *a, **k: exports.append(1) or real(*a, **k)
    )
    store = tmp_path / "store"

    def ort() -> Any:
        return chain("onnxruntime", "eager", eager_floor=False, store=store, memory=True)

    assert _run(ort()).winner == "onnxruntime"
    [stored] = (store / "artefacts").glob("*.bin")
    artefact, weights = artefacts.decode(stored.read_bytes(), stored.stem, "onnxruntime")
    graph = from_artefact(artefact.data)
    model = onnx.load_model_from_string(graph.model)
    tensor = model.graph.initializer[0]
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "w.bin").write_bytes(np.zeros_like(numpy_helper.to_array(tensor)).tobytes())
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value="w.bin")
    planted = to_artefact(dataclasses.replace(graph, model=model.SerializeToString()))
    stored.write_bytes(artefacts.encode(stored.stem, "onnxruntime", planted, weights))
    monkeypatch.chdir(cwd)
    record = _run(ort())
    assert record.winner == "onnxruntime" and _remembered(record)
    assert len(exports) == 2, record.notes  # exported again: the planted model never ran
    assert any("external data files" in n and "compiled as usual" in n for n in record.notes)
    assert "artefact" not in record.winning_attempt.details


# -- environment values and store URLs: one-line errors at chain() ------------------------


@pytest.mark.parametrize("value", ["inf", "1e400", "nan", "-1", "many"])
def test_a_bad_artefact_size_bound_is_a_one_line_error_at_chain(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("CHAIN_ARTEFACT_MAX_MB", value)
    with pytest.raises(InvalidOption, match="CHAIN_ARTEFACT_MAX_MB") as caught:
        chain("eager", memory=True)
    assert "\n" not in str(caught.value) and repr(value) in str(caught.value)
    monkeypatch.setenv("CHAIN_ARTEFACT_MAX_MB", "0.5")
    assert chain("eager", memory=True).memory.max_artefact_bytes == 2**19


def test_a_blank_signing_key_is_refused_not_unsigned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CHAIN_MEMORY_KEY='' is an error at chain(); blanked after the chain was built, it
    refuses entries (a warning, a cold start) and stores nothing unsigned."""
    for blank in ("", "  "):
        monkeypatch.setenv("CHAIN_MEMORY_KEY", blank)
        with pytest.raises(InvalidOption, match="CHAIN_MEMORY_KEY is set but blank"):
            chain("eager", store=tmp_path, memory=True)
    monkeypatch.delenv("CHAIN_MEMORY_KEY")
    _run(chain("eager", store=tmp_path, memory=True))
    backend = chain("eager", store=tmp_path, memory=True)
    monkeypatch.setenv("CHAIN_MEMORY_KEY", "")
    with pytest.warns(MemoryWarning, match="set but blank"):
        record = _run(backend)
    assert not _remembered(record) and record.winner == "eager"
    assert any("not remembered: CHAIN_MEMORY_KEY is set but blank" in n for n in record.notes)


BAD_URLS = [
    ("redis://host:99999", "Port out of range"),
    ("redis://[::1", "Invalid IPv6 URL"),
    ("redis://127.0.0.1/0?socket_timeout=abc", "socket_timeout='abc'"),
    ("redis://127.0.0.1/0?socket_timeout=nan", "socket_timeout='nan'"),
    ("redis://127.0.0.1/0?decode_responses=True", "the store holds bytes"),
    ("redis://127.0.0.1/x", "database 'x'"),
    ("redis://:hunter2@127.0.0.1:0", "port 0"),
]


@pytest.mark.parametrize(("url", "why"), BAD_URLS, ids=[u for u, _ in BAD_URLS])
def test_a_bad_redis_url_is_a_one_line_error_at_chain(
    monkeypatch: pytest.MonkeyPatch, url: str, why: str
) -> None:
    with pytest.raises(InvalidOption, match=why) as caught:
        chain("eager", store=url, memory=True)
    assert "\n" not in str(caught.value)
    monkeypatch.setenv("CHAIN_STORE", url)
    monkeypatch.setenv("CHAIN_MEMORY", "1")
    with pytest.raises(InvalidOption, match=why) as caught:
        chain("eager")
    assert "\n" not in str(caught.value) and "hunter2" not in str(caught.value)
    pytest.importorskip("redis", reason="the redis client: pip install 'backend-chain[fleet]'")
    with pytest.raises(StoreUnavailable, match=why) as down:  # the CLI and direct use
        RedisStore(url)
    assert "hunter2" not in str(down.value)


# -- Redis: every client failure is a warning and a cold start --------------------------


@pytest.fixture(scope="module")
def redis_url(redis_server: int) -> Iterator[str]:
    """Database 1 of this process's redis-server (tests/conftest.py), empty at the start."""
    import redis

    redis.Redis(port=redis_server, db=1).flushdb()
    yield f"redis://127.0.0.1:{redis_server}/1"


@pytest.fixture
def redis_client(redis_url: str) -> Any:
    """A client of the test server, its database emptied before the test."""
    import redis

    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    return client


@pytest.mark.parametrize("kind", ["hash", "list"])
def test_a_redis_key_of_the_wrong_type_is_a_warning_and_a_cold_start(
    redis_url: str, redis_client: Any, kind: str
) -> None:
    _run(chain("eager", store=redis_url, memory=True))
    [name] = redis_client.keys(RedisStore.PREFIX + "*")
    redis_client.delete(name)
    if kind == "hash":
        redis_client.hset(name, "winner", "eager")
    else:
        redis_client.rpush(name, b"{}")
    with pytest.warns(MemoryWarning, match="WRONGTYPE"):
        record = _run(chain("eager", store=redis_url, memory=True))
    assert not _remembered(record) and record.winner == "eager"
    assert any("store unusable" in n and "cold start" in n for n in record.notes), record.notes
    assert redis_client.type(name).decode() == kind  # left alone: the store was given up


@pytest.fixture
def garbage_server() -> Iterator[str]:
    """A TCP server that answers every request with a reply no Redis sends (`$abc`): the
    client raises ValueError, not a RedisError."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(65536)
                conn.sendall(b"$abc\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"redis://127.0.0.1:{server.getsockname()[1]}/0?socket_timeout=2"
    done.set()
    thread.join(timeout=5)
    server.close()


def test_a_server_answering_garbage_is_a_warning_and_a_cold_start(garbage_server: str) -> None:
    pytest.importorskip("redis", reason="the redis client: pip install 'backend-chain[fleet]'")
    with pytest.warns(MemoryWarning, match="ValueError") as caught:
        record = _run(chain("eager", store=garbage_server, memory=True))
    assert record.winner == "eager" and not _remembered(record)
    assert any("store unusable" in n for n in record.notes), record.notes
    assert len([w for w in caught if issubclass(w.category, MemoryWarning)]) == 1  # once


def test_an_oversized_redis_value_is_not_read(
    redis_url: str, redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its size is asked first (STRLEN): a value over the bound is never fetched."""
    _run(chain("eager", store=redis_url, memory=True))
    [name] = redis_client.keys(RedisStore.PREFIX + "*")
    size = redis_client.strlen(name)
    monkeypatch.setattr(RedisStore, "max_bytes", size - 1)
    with pytest.warns(MemoryWarning, match=f"holds {size} bytes, over the {size - 1}"):
        record = _run(chain("eager", store=redis_url, memory=True))
    assert not _remembered(record) and record.winner == "eager"


# -- the CLI: printable text, foreign keys skipped --------------------------------------


def test_store_list_escapes_control_characters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    evil = "\x1b]0;owned\x07\x1b[2J\r\u202e"
    decision = Decision(
        "eager",
        (Attempt("eager", Status.WON),),
        host=f"host{evil}",
        extra={"origin": f"model.py:1{evil}"},
    )
    LocalStore(tmp_path).put(KEY, encode(KEY, {}, decision))
    assert entries(tmp_path)[0]["host"] == f"host{evil}"  # the API gives the data as stored
    assert main(["--store", str(tmp_path), "list"]) == 0
    out = capsys.readouterr().out
    assert not any(ord(c) < 32 and c != "\n" for c in out), repr(out)
    assert "\u202e" not in out and "\x7f" not in out
    assert "host\\x1b]0;owned\\x07\\x1b[2J\\x0d\\u202e" in out
    assert "model.py:1\\x1b" in out


def test_a_foreign_redis_key_is_skipped_by_list_and_clear(
    redis_url: str, redis_client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """One name under the store's prefix that is not a decision key: `list` and `clear`
    skip it, say so, exit 0; `clear` removes every real entry and artefact."""
    _run(chain("eager", store=redis_url, memory=True))
    foreign = RedisStore.PREFIX + "not-a-key\x1b[2J"
    redis_client.set(foreign, b"someone else's")
    redis_client.set("backend-chain:artefact:\xff", b"planted")
    assert main(["--store", redis_url, "list"]) == 0
    listed = capsys.readouterr()
    assert "1 entry in" in listed.out and "\x1b" not in listed.err
    assert "skipped 1 foreign name(s): not-a-key\\x1b[2J" in listed.err
    assert main(["--store", redis_url, "clear"]) == 0
    cleared = capsys.readouterr()
    assert "removed 1 entr(ies)" in cleared.out
    assert "skipped 2 foreign name(s)" in cleared.err
    assert sorted(redis_client.keys("backend-chain:*")) == sorted(
        [foreign.encode(), "backend-chain:artefact:\xff".encode()]
    )
