"""Artefacts with remembered decisions (chain.memory.artefacts): a warm start builds the
ONNX Runtime winner from its stored export instead of exporting again; a tampered
artefact is ignored with its note; other weights miss; the size bound holds."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch

import backends.onnxruntime as ort_backend
from chain import Report, chain
from chain.memory import MemoryWarning
from chain.memory.artefacts import decode as decode_artefact
from tests.helpers import fresh_process, memory_env
from tests.models import MLP

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("onnxruntime")


@pytest.fixture
def exports(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per ONNX export the ONNX Runtime backend runs in this process."""
    calls: list[int] = []
    real = ort_backend.export_onnx

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(ort_backend, "export_onnx", counting)
    return calls


def _ort(store: Path, **kw: Any) -> Any:
    """ONNX Runtime first, no eager floor: it wins whenever it passes."""
    return chain("onnxruntime", "eager", eager_floor=False, store=store, memory=True, **kw)


def _run(backend: Any, seed: int = 0, batch: int = 4) -> Any:
    """A small MLP (weights from `seed`) compiled afresh; checked against eager; its record."""
    torch._dynamo.reset()
    torch.manual_seed(seed)
    model = MLP().eval()
    x = torch.randn(batch, 32)
    with torch.no_grad():
        out = torch.compile(model, backend=backend, dynamic=False)(x)
        torch.testing.assert_close(out, model(x))
    return backend.report.graphs[-1]


def _loaded(record: Any) -> bool:
    return any("built from its stored artefact" in n for n in record.notes)


def test_a_hit_builds_the_winner_from_its_artefact(tmp_path: Path, exports: list[int]) -> None:
    first = _run(_ort(tmp_path))
    assert first.winner == "onnxruntime" and len(exports) == 1
    [stored] = (tmp_path / "artefacts").glob("*.bin")
    artefact, _ = decode_artefact(stored.read_bytes(), stored.stem, "onnxruntime")
    assert artefact.reads  # the weights it bakes in are part of its key
    second = _run(_ort(tmp_path))
    assert len(exports) == 1, second.notes  # no export in the warm compile
    assert _loaded(second), second.notes
    won = second.winning_attempt
    assert won.details["from_artefact"] is True
    assert won.details["artefact"] == {"key": stored.stem, "bytes": len(artefact.data)}
    assert won.max_abs_err is not None  # verified against eager now


def test_a_tampered_artefact_is_ignored_with_its_note(tmp_path: Path, exports: list[int]) -> None:
    _run(_ort(tmp_path))
    [stored] = (tmp_path / "artefacts").glob("*.bin")
    data = bytearray(stored.read_bytes())
    data[-100] ^= 0xFF  # a byte of the model's weights
    stored.write_bytes(bytes(data))
    with pytest.warns(MemoryWarning, match="bytes do not match their digest"):
        record = _run(_ort(tmp_path))
    assert len(exports) == 2  # exported again, the tampered model never loaded
    assert not _loaded(record)
    assert any("ignored: artefact bytes do not match" in n for n in record.notes), record.notes
    decode_artefact(stored.read_bytes(), stored.stem, "onnxruntime")  # replaced, valid
    assert _loaded(_run(_ort(tmp_path)))


def test_a_forged_artefact_fails_its_signature(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exports: list[int]
) -> None:
    """Digests recomputed after the edit: only the HMAC under CHAIN_MEMORY_KEY catches it."""
    monkeypatch.setenv("CHAIN_MEMORY_KEY", "fleet-secret")
    _run(_ort(tmp_path))
    [stored] = (tmp_path / "artefacts").glob("*.bin")
    first, _, rest = stored.read_bytes().partition(b"\n")
    size = int(first.split(b" ")[2])
    header, body = json.loads(rest[:size]), bytearray(rest[size:])
    body[-100] ^= 0xFF
    header["data_sha256"] = hashlib.sha256(body).hexdigest()
    names = ("format", "key", "backend", "reads", "weights", "size", "data_sha256")
    raw = json.dumps({k: header[k] for k in names}, sort_keys=True, separators=(",", ":"))
    header["digest"] = hashlib.sha256(raw.encode()).hexdigest()
    text = json.dumps(header, sort_keys=True).encode()
    stored.write_bytes(b"backend-chain-artefact 1 %d\n" % len(text) + text + bytes(body))
    with pytest.warns(MemoryWarning, match="artefact signature does not match"):
        record = _run(_ort(tmp_path))
    assert len(exports) == 2 and not _loaded(record)


def test_other_weights_miss_the_artefact(tmp_path: Path, exports: list[int]) -> None:
    """Same graph and decision, other weights: the stored model would compute wrong values."""
    _run(_ort(tmp_path), seed=0)
    record = _run(_ort(tmp_path), seed=1)  # checks the output against the new weights
    assert len(exports) == 2
    assert any("remembered:" in n for n in record.notes)  # the decision still holds
    assert any("not used (made for other weights)" in n for n in record.notes), record.notes
    assert _loaded(_run(_ort(tmp_path), seed=1))  # the artefact was replaced
    assert len(exports) == 2


def test_size_bound_stores_no_artefact(tmp_path: Path, exports: list[int]) -> None:
    record = _run(_ort(tmp_path, max_artefact_mb=0))
    assert any("artefact not stored" in n and "max_artefact_mb 0" in n for n in record.notes)
    assert not list(tmp_path.glob("artefacts/*.bin"))
    assert not _loaded(_run(_ort(tmp_path, max_artefact_mb=0)))
    assert len(exports) == 2


# -- a second process -----------------------------------------------------------------

_PROCESS = """
import json, sys
import torch
import backends.onnxruntime as ort_backend
import chain.select.candidates as candidates
from chain import chain
from chain.bench import zoo

compiled, exported = [], []
real_try, real_export = candidates.try_backend, ort_backend.export_onnx
def counting(backend, *args, **kwargs):
    compiled.append(backend.name)
    return real_try(backend, *args, **kwargs)
def exporting(*args, **kwargs):
    exported.append(1)
    return real_export(*args, **kwargs)
candidates.try_backend, ort_backend.export_onnx = counting, exporting

backend = chain("onnxruntime", "eager", eager_floor=False, report_path=sys.argv[1])
model = zoo.build("bert")
fast = torch.compile(model, backend=backend)
with torch.no_grad():
    for shape in (0, 1):
        inputs = zoo.inputs("bert", shape)
        torch.testing.assert_close(fast(*inputs), model(*inputs))
print(json.dumps({"compiled": compiled, "exports": len(exported)}))
"""


@pytest.mark.slow
def test_a_second_process_exports_nothing(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    env = memory_env(tmp_path / "cache")

    def process(name: str) -> tuple[Report, dict[str, Any]]:
        counts = fresh_process(_PROCESS, str(tmp_path / name), env=env)
        return Report.load(tmp_path / name), counts

    cold, cold_counts = process("cold.json")
    assert [g.winner for g in cold.graphs] == ["onnxruntime", "onnxruntime"]  # 2 shapes
    assert cold_counts["exports"] >= 2
    assert len(list((tmp_path / "cache" / "decisions" / "artefacts").glob("*.bin"))) == 2

    warm, warm_counts = process("warm.json")
    assert warm_counts == {"compiled": ["onnxruntime", "onnxruntime"], "exports": 0}
    for graph in warm.graphs:
        assert _loaded(graph), graph.notes
        assert graph.winning_attempt.details["from_artefact"] is True


def test_eight_threads_make_the_first_warm_call_together(
    tmp_path: Path, exports: list[int]
) -> None:
    """A tiny BertModel whose decisions and ONNX artefacts are stored (lengths 8 then 12: a
    static and a symbolic graph): in a fresh compile, 8 threads make the first call at once,
    then the second length at once. Nothing raises, every answer equals eager's, nothing is
    exported again, and each graph's winner was built from its artefact (dynamo compiles a
    frame once per thread that missed its cache: each of those compiles is a warm hit)."""
    import threading

    from tests.models import tiny_bert

    torch.manual_seed(0)
    model, _ = tiny_bert()
    model.eval()
    ids = {n: torch.randint(0, 100, (2, n)) for n in (8, 12)}
    with torch.no_grad():
        want = {n: model(x).last_hidden_state for n, x in ids.items()}
        cold = _ort(tmp_path)
        compiled = torch.compile(model, backend=cold)
        for n in (8, 12):
            compiled(ids[n])
    cold_exports = len(exports)
    assert [g.winner for g in cold.report.graphs] == ["onnxruntime", "onnxruntime"]

    torch._dynamo.reset()
    warm = _ort(tmp_path)
    compiled = torch.compile(model, backend=warm)
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []
    wrong: list[str] = []

    def call() -> None:
        try:
            for n in (8, 12):
                barrier.wait()
                with torch.no_grad():
                    got = compiled(ids[n]).last_hidden_state
                if not torch.allclose(got, want[n], atol=1e-5, rtol=1e-4):
                    wrong.append(f"length {n}: max err {(got - want[n]).abs().max():.3g}")
        except BaseException as exc:  # recorded: the assertion below names it
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    assert not wrong, wrong
    assert len(exports) == cold_exports  # the warm start exported nothing
    graphs = warm.report.graphs  # dynamo may compile a frame once per thread that missed it
    assert len(graphs) >= 2 and {g.winner for g in graphs} == {"onnxruntime"}
    assert all(_loaded(g) for g in graphs), [g.notes for g in graphs]
