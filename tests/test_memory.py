"""Remembered decisions (chain.memory): a warm process compiles only the winner; any change
of key misses; corrupt, tampered or unreachable stores are notes and cold starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import fx

import chain.memory.key as memory_key
import chain.select.candidates as candidates
from backends.errors import InvalidOption
from chain import Report, Status, chain
from chain.memory import MemoryWarning, clear, entries, show
from chain.memory.entry import decode
from tests.helpers import cli_runs, free_port, fresh_process, memory_env
from tests.models import MLP

ROOT = Path(__file__).resolve().parents[1]


def _run(backend: Any, batch: int = 4) -> Any:
    """A small MLP compiled afresh through `backend` at `batch` rows; returns its record."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, x = MLP().eval(), torch.randn(batch, 32)
    with torch.no_grad():
        out = torch.compile(model, backend=backend, dynamic=False)(x)
        torch.testing.assert_close(out, model(x))
    return backend.report.graphs[-1]


def _fastest(store: Any) -> Any:
    """Inductor and eager, timed, remembering in `store`. No eager floor: under it a winner
    that tied below 1x eager is not remembered (its own test below), which made these
    tests' second chain miss on a noisy machine."""
    return chain("inductor", "eager", mode="fastest", eager_floor=False, store=store, memory=True)


def _remembered(record: Any) -> bool:
    return any(n.startswith("remembered:") for n in record.notes)


@pytest.fixture
def compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The backends compiled in this process, by name, in order."""
    names: list[str] = []
    real = candidates.try_backend

    def counting(backend: Any, *args: Any, **kwargs: Any) -> Any:
        names.append(backend.name)
        return real(backend, *args, **kwargs)

    monkeypatch.setattr(candidates, "try_backend", counting)
    return names


# -- in one process: hits, misses, refused entries ------------------------------------


def test_hit_compiles_only_the_winner_and_keeps_the_figures(
    tmp_path: Path, compiles: list[str]
) -> None:
    first = _run(_fastest(tmp_path))
    assert not _remembered(first)
    assert sorted(compiles) == ["eager", "inductor"]
    compiles.clear()
    second = _run(_fastest(tmp_path))
    assert _remembered(second), second.notes
    assert compiles == [first.winner]
    assert second.winner == first.winner
    assert [(a.backend, a.status) for a in second.attempts] == [
        (a.backend, a.status) for a in first.attempts
    ]
    won = second.winning_attempt
    assert won.latency_ms == first.winning_attempt.latency_ms  # the decision's figures
    assert won.details["remembered"]["compiled"] is True
    assert won.max_abs_err is not None  # verified against eager now
    others = [a for a in second.attempts if a.backend != second.winner]
    assert all(a.details["remembered"]["compiled"] is False for a in others)
    assert second.eager_ms == first.eager_ms


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"mode": "fastest"}, id="mode"),
        pytest.param(
            {"options": {"inductor": {"mode": "max-autotune-no-cudagraphs"}}}, id="options"
        ),
        pytest.param({"eager_floor": False}, id="eager_floor"),
        pytest.param({"batch": 5}, id="shape"),
        pytest.param({"versions": True}, id="versions"),
        pytest.param({"threads": True}, id="threads"),
    ],
)
def test_a_change_of_key_misses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: dict[str, Any]
) -> None:
    _run(chain("eager", store=tmp_path, memory=True))
    assert _remembered(_run(chain("eager", store=tmp_path, memory=True)))
    batch = change.pop("batch", 4)
    if change.pop("versions", False):
        packages = dict(memory_key._packages(), torch="9.9.9")
        monkeypatch.setattr(memory_key, "_packages", lambda: packages)
    if change.pop("threads", False):
        monkeypatch.setattr(torch, "get_num_threads", lambda: 97)
    backends = ("inductor", "eager") if "options" in change else ("eager",)
    record = _run(chain(*backends, store=tmp_path, memory=True, **change), batch=batch)
    assert not _remembered(record), record.notes


def test_memory_off_by_option_and_by_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHAIN_MEMORY", "1")
    monkeypatch.setenv("CHAIN_STORE", str(tmp_path))
    _run(chain("eager"))
    assert len(entries()) == 1
    assert _remembered(_run(chain("eager")))
    assert not _remembered(_run(chain("eager", memory=False)))
    monkeypatch.setenv("CHAIN_MEMORY", "0")
    assert chain("eager").memory is None


def test_corrupt_entry_is_ignored_with_a_note_and_replaced(tmp_path: Path) -> None:
    _run(chain("eager", store=tmp_path, memory=True))
    [path] = tmp_path.glob("*.json")
    path.write_bytes(path.read_bytes()[:-40])  # truncated
    with pytest.warns(MemoryWarning, match="ignored: not JSON"):
        record = _run(chain("eager", store=tmp_path, memory=True))
    assert not _remembered(record)
    assert any("ignored: not JSON" in n for n in record.notes), record.notes
    decision, _ = decode(path.read_bytes(), path.stem)  # replaced by a valid entry
    assert decision.winner == "eager"


def _edit(path: Path, change: Any) -> None:
    """Change an entry's decision and fix its digest: only a signature can catch that."""
    import hashlib

    entry = json.loads(path.read_bytes())
    before = json.dumps(entry["decision"], sort_keys=True)
    change(entry["decision"])
    assert json.dumps(entry["decision"], sort_keys=True) != before, "the edit changed nothing"
    body = {k: entry[k] for k in ("format", "key", "parts", "decision")}
    raw = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    entry["digest"] = hashlib.sha256(raw).hexdigest()
    path.write_text(json.dumps(entry))


def test_edited_entry_fails_its_digest(tmp_path: Path) -> None:
    _run(chain("eager", store=tmp_path, memory=True))
    [path] = tmp_path.glob("*.json")
    path.write_text(path.read_text().replace('"host": "', '"host": "x'))
    with pytest.warns(MemoryWarning, match="digest does not match"):
        record = _run(chain("eager", store=tmp_path, memory=True))
    assert not _remembered(record)


def test_tampered_entry_fails_its_signature(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHAIN_MEMORY_KEY", "fleet-secret")
    _run(_fastest(tmp_path))  # no eager floor: a noisy timing is stored all the same
    [path] = tmp_path.glob("*.json")
    assert _remembered(_run(_fastest(tmp_path)))

    def to_the_loser(decision: dict[str, Any]) -> None:
        # whichever lost (eager wins on a busy machine): an edit that changes nothing keeps
        # its signature, and the test then failed for want of a tampering
        loser = "eager" if decision["winner"] == "inductor" else "inductor"
        for a in decision["attempts"]:
            a["status"] = "won" if a["backend"] == loser else "slower"
        decision["winner"] = loser

    _edit(path, to_the_loser)
    with pytest.warns(MemoryWarning, match="signature does not match"):
        record = _run(_fastest(tmp_path))
    assert not _remembered(record)
    assert any("signature does not match" in n for n in record.notes), record.notes
    assert entries(tmp_path)[0]["check"] == "ok"  # replaced, signed again


def test_unsigned_entry_is_refused_when_a_key_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _run(chain("eager", store=tmp_path, memory=True))
    monkeypatch.setenv("CHAIN_MEMORY_KEY", "fleet-secret")
    with pytest.warns(MemoryWarning, match="not signed"):
        record = _run(chain("eager", store=tmp_path, memory=True))
    assert not _remembered(record)


def test_a_remembered_winner_that_fails_now_means_a_selection(tmp_path: Path) -> None:
    broken = {"now": False}

    def flaky(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        if broken["now"]:
            raise RuntimeError("flaky broke")
        return gm.forward

    # eager_floor=False: flaky is eager's twin, and the floor made its win (and whether a tie
    # at 0.98x or a noisy one was remembered) hang on the machine's load; the test is about a
    # remembered winner that fails now, not about speed
    first = _run(chain(flaky, "eager", eager_floor=False, store=tmp_path, memory=True))
    assert first.winner == "flaky"
    assert entries(tmp_path)[0]["winner"] == "flaky"  # remembered
    broken["now"] = True
    record = _run(chain(flaky, "eager", eager_floor=False, store=tmp_path, memory=True))
    assert record.winner == "eager"
    assert not _remembered(record)
    assert any("remembered winner flaky failed now" in n for n in record.notes), record.notes
    [row] = entries(tmp_path)
    assert row["winner"] == "eager"  # the entry was replaced


def test_bad_options_are_one_line_errors() -> None:
    with pytest.raises(InvalidOption, match="memory"):
        chain("eager", memory="yes")
    with pytest.raises(InvalidOption, match="redis://"):
        chain("eager", store="http://cache:6379")


def test_threads_share_one_memory(tmp_path: Path) -> None:
    """Graphs compiled from threads (one per shape) each get their record and their entry."""
    import concurrent.futures

    backend = chain("eager", store=tmp_path, memory=True)
    torch.manual_seed(0)
    model = MLP().eval()
    fast = torch.compile(model, backend=backend, dynamic=False)

    def call(batch: int) -> None:
        with torch.no_grad():
            x = torch.randn(batch, 32)
            torch.testing.assert_close(fast(x), model(x))

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(call, (2, 3, 4, 5)))
    assert len(backend.report.graphs) == 4
    assert len(entries(tmp_path)) == 4


# -- stores ---------------------------------------------------------------------------

_WRITER = """
import sys
from chain.memory import Decision, open_store
from chain.memory.entry import encode
from chain.report.records import Attempt, Status
store = open_store(sys.argv[1])
for i in range(int(sys.argv[3])):
    d = Decision(sys.argv[2], (Attempt(sys.argv[2], Status.WON, latency_ms=float(i)),))
    store.put("ab" * 16, encode("ab" * 16, {"writer": sys.argv[2]}, d))
"""


def test_two_processes_writing_one_key_leave_a_valid_entry(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path), name, "300"], env=env)
        for name in ("inductor", "onnxruntime")
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    decision, parts = decode((tmp_path / ("ab" * 16 + ".json")).read_bytes(), "ab" * 16)
    assert decision.winner in ("inductor", "onnxruntime")
    assert parts["writer"] == decision.winner
    assert [p.name for p in tmp_path.iterdir()] == ["ab" * 16 + ".json"]  # no temp files left


def test_unreachable_redis_is_a_warning_and_a_cold_start(compiles: list[str]) -> None:
    pytest.importorskip("redis", reason="the redis client: pip install 'backend-chain[fleet]'")
    backend = chain("eager", store=f"redis://127.0.0.1:{free_port()}/0", memory=True)
    with pytest.warns(MemoryWarning, match="cold start"):
        record = _run(backend)
    assert record.winner == "eager"
    assert any("store unusable" in n for n in record.notes), record.notes
    _run(backend, 5)  # the store is not asked again: no second wait, still a note
    assert any("store unusable" in n for n in backend.report.graphs[-1].notes)
    assert compiles == ["eager", "eager"]


@pytest.fixture(scope="module")
def redis_url(redis_server: int) -> Iterator[str]:
    """Database 0 of this process's redis-server (tests/conftest.py), empty at the start."""
    import redis

    redis.Redis(port=redis_server, db=0).flushdb()
    yield f"redis://127.0.0.1:{redis_server}/0"


def test_redis_store_serves_a_second_chain(redis_url: str, compiles: list[str]) -> None:
    clear(redis_url)
    first = _run(_fastest(redis_url))
    compiles.clear()
    second = _run(_fastest(redis_url))
    assert _remembered(second), second.notes
    assert compiles == [first.winner]
    [row] = entries(redis_url)
    assert row["winner"] == first.winner and row["check"] == "ok"
    assert show(row["key"], redis_url)["decision"]["winner"] == first.winner
    assert clear(redis_url) == 1
    assert entries(redis_url) == []


def test_redis_store_keeps_artefacts(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ONNX Runtime winner's export goes to Redis with its decision; a second chain on
    the same store builds its session from it without exporting; clear removes both."""
    import redis

    import backends.onnxruntime as ort_backend

    exported: list[int] = []
    real = ort_backend.export_onnx
    monkeypatch.setattr(
        ort_backend, "export_onnx", lambda *a, **k: exported.append(1) or real(*a, **k)
    )
    clear(redis_url)
    backend = ("onnxruntime", "eager")
    _run(chain(*backend, eager_floor=False, store=redis_url, memory=True))
    client = redis.Redis.from_url(redis_url)
    [name] = client.keys("backend-chain:artefact:*")
    second = _run(chain(*backend, eager_floor=False, store=redis_url, memory=True))
    assert exported == [1], second.notes
    assert any("built from its stored artefact" in n for n in second.notes), second.notes
    assert second.winning_attempt.details["artefact"]["key"] == name.decode().split(":")[-1]
    assert clear(redis_url) == 1
    assert client.keys("backend-chain:*") == []


def test_store_cli_lists_shows_and_clears(tmp_path: Path) -> None:
    _run(chain("eager", store=tmp_path, memory=True))
    [key] = [p.stem for p in tmp_path.glob("*.json")]
    store = ["store", "--store", str(tmp_path)]
    # the four commands in order, in one fresh process (one torch import, not four)
    listed, shown, missing, cleared = cli_runs(
        [*store, "list"], [*store, "show", key], [*store, "show", "0" * 32], [*store, "clear"]
    )
    assert listed.returncode == 0 and key in listed.stdout and "eager" in listed.stdout
    assert json.loads(shown.stdout)["decision"]["winner"] == "eager"
    assert missing.returncode == 2 and missing.stderr.startswith("chain store: error: no entry")
    assert "Traceback" not in missing.stderr
    assert cleared.returncode == 0
    assert list(tmp_path.glob("*.json")) == []


# -- a second process -----------------------------------------------------------------

_PROCESS = """
import json, sys
import torch
import chain.select.candidates as candidates
from chain import chain
from chain.bench import zoo

compiled = []
real = candidates.try_backend
def counting(backend, *args, **kwargs):
    compiled.append(backend.name)
    return real(backend, *args, **kwargs)
candidates.try_backend = counting

backend = chain("onnxruntime", "eager", mode="fastest", eager_floor=False,
                report_path=sys.argv[1])
fast = torch.compile(zoo.build("bert"), backend=backend)
with torch.no_grad():
    for shape in (0, 1):
        fast(*zoo.inputs("bert", shape))
print(json.dumps(compiled))
"""


@pytest.mark.slow
def test_a_second_process_compiles_only_the_winner(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    env = memory_env(tmp_path / "cache")

    def process(name: str) -> tuple[Report, list[str]]:
        compiled = fresh_process(_PROCESS, str(tmp_path / name), env=env)
        return Report.load(tmp_path / name), compiled

    cold, cold_compiled = process("cold.json")
    assert len(cold.graphs) == 2  # two shapes: a static graph, then a dynamic one
    assert sorted(cold_compiled) == ["eager", "eager", "onnxruntime", "onnxruntime"]
    assert not any(_remembered(g) for g in cold.graphs)
    assert len(list((tmp_path / "cache" / "decisions").glob("*.json"))) == 2

    warm, warm_compiled = process("warm.json")
    why = [(g.notes, [(a.backend, a.status, a.reason) for a in g.attempts]) for g in warm.graphs]
    assert warm_compiled == [g.winner for g in cold.graphs], why  # the winners, nothing else
    for before, after in zip(cold.graphs, warm.graphs, strict=True):
        assert _remembered(after), after.notes
        assert after.winner == before.winner
        now = [a for a in after.attempts if a.details["remembered"]["compiled"]]
        assert [a.backend for a in now] == [after.winner]  # counted from the report
        assert after.winning_attempt.speedup == before.winning_attempt.speedup
        assert [a.status for a in after.attempts] == [a.status for a in before.attempts]
    assert {a.status for g in warm.graphs for a in g.attempts} <= {Status.WON, Status.SLOWER}


# -- the one verification of a remembered winner --------------------------------------


class _Drifts:
    """A winner that computes like eager until `rel` is set, then every floating output is
    off by that relative amount (a compiler that went wrong after its decision was stored)."""

    __name__ = "drifts"

    def __init__(self) -> None:
        self.rel = 0.0

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        def run(*args: Any) -> Any:
            outs = gm(*args)
            return type(outs)(
                o * (1 + self.rel) if isinstance(o, torch.Tensor) and o.is_floating_point() else o
                for o in outs
            )

        return run


def _drifting(drifts: _Drifts, store: Path) -> Any:
    """drifts before eager, no eager floor: eager's twin must not lose on a timing tie."""
    return chain(drifts, "eager", store=store, memory=True, eager_floor=False)


def _bert_records(backend: Any) -> list[Any]:
    """A tiny transformers BertModel compiled afresh through `backend`, called at two input
    shapes (one graph each); returns their records."""
    from tests.models import tiny_bert

    torch._dynamo.reset()
    torch.manual_seed(0)
    model, _ = tiny_bert()
    model.eval()
    fast = torch.compile(model, backend=backend, dynamic=False)
    with torch.no_grad():
        for shape in ((2, 8), (3, 12)):
            ids = torch.randint(0, 100, shape)
            got, want = fast(ids).last_hidden_state, model(ids).last_hidden_state
            torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
    return backend.report.graphs[-2:]


@pytest.fixture
def fp64_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times the chain ran a graph in float64 (one entry per run)."""
    import chain.judge.fp64 as fp64

    runs: list[int] = []
    real = fp64.run_fp64

    def counting(gm: fx.GraphModule, inputs: Any) -> Any:
        runs.append(1)
        return real(gm, inputs)

    monkeypatch.setattr(fp64, "run_fp64", counting)
    return runs


def test_a_remembered_winner_is_verified_by_one_eager_run(
    tmp_path: Path, fp64_runs: list[int]
) -> None:
    """On a hit, the winner is compared with eager within what its decision recorded of
    eager's own error: no float64 run unless that comparison is not clearly within bounds."""
    drifts = _Drifts()
    cold = _bert_records(_drifting(drifts, tmp_path))
    assert [r.winner for r in cold] == ["drifts", "drifts"]
    assert len(fp64_runs) == 2  # selection: one float64 reference per graph
    fp64_runs.clear()
    warm = _bert_records(_drifting(drifts, tmp_path))
    assert all(_remembered(r) for r in warm), [r.notes for r in warm]
    assert [r.winner for r in warm] == ["drifts", "drifts"]
    assert fp64_runs == []
    for record in warm:
        won = record.winning_attempt
        assert won.status is Status.WON
        assert won.details["verified"] == "against eager within the recorded error bound"


@pytest.mark.parametrize("rel", [1e-2, 1e-4])
def test_a_remembered_winner_now_wrong_is_caught_on_its_first_call(
    tmp_path: Path, fp64_runs: list[int], rel: float
) -> None:
    """A winner that returns wrong numbers now (off by `rel`, far above fp32 rounding) fails
    the quick comparison, is judged by the float64 rule, and loses: selection runs anew."""
    drifts = _Drifts()
    _bert_records(_drifting(drifts, tmp_path))
    drifts.rel = rel
    fp64_runs.clear()
    warm = _bert_records(_drifting(drifts, tmp_path))
    assert [r.winner for r in warm] == ["eager", "eager"]
    assert len(fp64_runs) == 2  # the float64 rule judged each graph
    for record in warm:
        assert not _remembered(record)
        [note] = [n for n in record.notes if "remembered winner drifts failed now" in n]
        assert "(mismatch: output 0: RMSE vs float64" in note, note
        drifted = [a for a in record.attempts if a.backend == "drifts"]
        assert drifted[-1].status is Status.MISMATCH


# -- a compiler fakifies the chain's copies as dynamo's own inputs ----------------------


def test_inductor_compiles_copied_inputs_with_dynamos_sizes() -> None:
    """The chain hands backends copies of the activations; inductor must fakify them with
    dynamo's symbolic context, not as unknown tensors with fresh symbolic sizes (which made
    ConvNeXt under fastest crash in dynamo's guard building). Small ConvNeXt, two shapes."""
    from torch._guards import TracingContext
    from transformers import ConvNextConfig, ConvNextModel

    backend = chain("inductor", "eager", memory=False)
    unknown: list[list[str]] = []

    def watched(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        fn = backend(gm, example_inputs)
        env = TracingContext.get().fake_mode.shape_env
        names = [str(s.name) for sources in env.var_to_sources.values() for s in sources]
        unknown.append([n for n in names if "unknown_tensor" in n])
        return fn

    torch._dynamo.reset()
    torch.manual_seed(0)
    config = ConvNextConfig(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, image_size=32)
    model = ConvNextModel(config).eval()
    fast = torch.compile(model, backend=watched, dynamic=False)
    with torch.no_grad():
        for shape in ((1, 3, 32, 32), (2, 3, 48, 48)):
            x = torch.randn(shape)
            got, want = fast(x).last_hidden_state, model(x).last_hidden_state
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert unknown == [[], []]
    assert [g.winner for g in backend.report.graphs] != [None, None]


def _record(speedup: float | None) -> Any:
    from chain import Attempt, GraphRecord

    won = Attempt("onnxruntime", Status.WON, latency_ms=1.467, speedup=speedup)
    eager = Attempt("eager", Status.NOT_TRIED, reason="a backend earlier won")
    return GraphRecord(0, "f", "forward", 3, {}, [], (won, eager), "onnxruntime")


@pytest.mark.parametrize(
    ("floor", "speedup", "kept"),
    [(True, 0.76, False), (True, 1.0, True), (True, 1.3, True), (True, None, True),
     (False, 0.76, True)],
)  # fmt: skip
def test_a_tie_won_below_eagers_speed_is_not_remembered(
    floor: bool, speedup: float | None, kept: bool
) -> None:
    """Under the eager floor, a winner measured below 1x eager won a tie within this run's
    noise (seen: ONNX Runtime at 0.76x on a loaded machine); a hit skips timing, so storing
    it would keep the slower backend in every later process. Without the floor the user
    asked for such winners; unmeasured ones (None) are kept."""
    c = chain("onnxruntime", "eager", eager_floor=floor, memory=True)
    why = c.recall.tie_not_kept(_record(speedup))
    assert (why is None) is kept
    if not kept:
        assert why == (
            "memory: not remembered: onnxruntime won at 0.76x eager, within the noise of "
            "this run; the next process selects again"
        )
