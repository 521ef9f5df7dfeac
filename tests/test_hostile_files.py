"""Issue 32, hostile files: everything the library writes or reads goes through one file layer
(backends.common.files). A symlink, FIFO, device or folder planted where the decision store,
the live report, the HTML page or `chain report -o` would write is refused with one line and
left as it was; a link's target is never written; reads never block on a FIFO, never eat
/dev/zero and stop at a size limit; the store's folder is private to its user."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import resource
import signal
import stat
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from backends.common.files import (
    UnsafeFile,
    atomic_path,
    atomic_write,
    private_dir,
    read_bounded,
)
from chain import Report, Status, chain
from chain.memory import MemoryWarning
from chain.memory.stores import LocalStore, StoreUnavailable
from chain.report.look import html
from chain.report.records import Attempt, GraphRecord
from tests.helpers import cli_runs
from tests.models import MLP

ROOT = Path(__file__).resolve().parents[1]
KEY = "ab" * 16  # a decision key as the chain makes them (hex)
PRECIOUS = "precious: must never be overwritten\n"


# -- helpers ----------------------------------------------------------------------------------


@contextlib.contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Fail with TimeoutError if the block is still running after `seconds` (a hang guard)."""

    def expired(signum: int, frame: Any) -> None:
        raise TimeoutError(f"still blocked after {seconds} s: the read hangs")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@contextlib.contextmanager
def memory_cap(extra_bytes: int) -> Iterator[None]:
    """Cap this process's address space at its size now plus `extra_bytes`: a read that
    eats /dev/zero fails with MemoryError instead of taking the machine's memory."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    status = Path("/proc/self/status").read_text()
    found = re.search(r"VmSize:\s+(\d+) kB", status)
    assert found is not None, "no VmSize in /proc/self/status"
    resource.setrlimit(resource.RLIMIT_AS, (int(found[1]) * 1024 + extra_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _victim(tmp_path: Path) -> Path:
    """A file a planted link points at: it must keep its contents and mode."""
    victim = tmp_path / "victim.txt"
    victim.write_text(PRECIOUS)
    victim.chmod(0o644)
    return victim


def _intact(victim: Path) -> None:
    assert victim.read_text() == PRECIOUS
    assert stat.S_IMODE(victim.stat().st_mode) == 0o644


def _device(path: Path) -> Path:
    """A character device node like /dev/null (1, 3) at `path`; skips where mknod is denied."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod needs root (CAP_MKNOD): the device case runs as root only")
    return path


def _plant(kind: str, path: Path, tmp_path: Path) -> Callable[[], None]:
    """Put a `kind` at `path`; returns a check that it is still there, unchanged."""
    if kind in ("symlink", "dangling symlink"):
        target = _victim(tmp_path) if kind == "symlink" else tmp_path / "nobody-made-this"
        path.symlink_to(target)

        def link_kept() -> None:
            _is_link(path, target)
            if kind == "symlink":
                _intact(target)
            else:
                _absent(target)

        return link_kept
    if kind == "fifo":
        os.mkfifo(path)
        return lambda: _is(path, stat.S_ISFIFO)
    if kind == "directory":
        path.mkdir()

        def folder_kept() -> None:
            _is(path, stat.S_ISDIR)
            assert list(path.iterdir()) == []

        return folder_kept
    assert kind == "device"
    _device(path)
    return lambda: _is(path, stat.S_ISCHR)


def _is(path: Path, test: Callable[[int], bool]) -> None:
    mode = os.lstat(path).st_mode
    assert test(mode), f"{path} was replaced: now {stat.filemode(mode)}"


def _is_link(path: Path, target: Path) -> None:
    assert path.is_symlink() and os.readlink(path) == str(target)


def _absent(path: Path) -> None:
    assert not os.path.lexists(path), f"{path} was created through a link"


def _no_temporaries(folder: Path) -> None:
    assert [p.name for p in folder.iterdir() if p.name.endswith(".tmp")] == []


KINDS = ["symlink", "dangling symlink", "fifo", "directory", "device"]
WORDS = {
    "symlink": "a symbolic link",
    "dangling symlink": "a symbolic link",
    "fifo": "a FIFO",
    "directory": "a directory",
    "device": "a character device",
}


def _mlp_run(backend: Any, batch: int = 4) -> Any:
    """A small MLP compiled afresh through `backend`, checked against eager; its record."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, x = MLP().eval(), torch.randn(batch, 32)
    with torch.no_grad():
        out = torch.compile(model, backend=backend, dynamic=False)(x)
        torch.testing.assert_close(out, model(x))
    return backend.report.graphs[-1]


def _remembered(record: Any) -> bool:
    return any(n.startswith("remembered:") for n in record.notes)


def _cold_start(record: Any, words: str) -> None:
    """The record says the store was refused for `words` and the graph was selected anew."""
    assert not _remembered(record), record.notes
    assert any("cold start" in n and words in n for n in record.notes), record.notes


def _one_graph_report() -> Report:
    record = GraphRecord(
        id=0,
        fingerprint="f",
        origin="o",
        num_nodes=1,
        ops={},
        inputs=[],
        winner="eager",
        attempts=(Attempt("eager", Status.WON, "ran"),),
    )
    return Report([record])


# -- the file layer itself ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_atomic_write_refuses_every_non_regular_target(kind: str, tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    still_there = _plant(kind, target, tmp_path)
    with pytest.raises(
        UnsafeFile, match=re.escape(f"{target}: not a regular file ({WORDS[kind]})")
    ):
        atomic_write(target, "new")
    with pytest.raises(UnsafeFile), atomic_path(target) as tmp:
        tmp.write_text("new")  # never reached: refused before a temporary exists
    still_there()
    _no_temporaries(tmp_path)


def test_unsafe_file_is_an_oserror_in_one_line(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(OSError) as caught:  # callers' `except OSError` paths still catch it
        atomic_write(fifo, b"x")
    assert isinstance(caught.value, UnsafeFile)
    assert str(caught.value) == f"{fifo}: not a regular file (a FIFO)"


def test_a_link_planted_at_the_temporary_name_is_never_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """O_EXCL: the first temporary name is taken by a planted link; the write uses another
    and the link's target is untouched (the names are made predictable for the test)."""
    victim = _victim(tmp_path)
    names = iter([uuid.UUID("1" * 32), uuid.UUID("2" * 32)])
    monkeypatch.setattr(uuid, "uuid4", lambda: next(names))
    target = tmp_path / "out.json"
    planted = tmp_path / f".out.json.{os.getpid()}.{'1' * 12}.tmp"
    planted.symlink_to(victim)
    atomic_write(target, "new")
    assert target.read_text() == "new"
    _intact(victim)
    _is_link(planted, victim)


def test_a_replaced_file_keeps_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "private.json"
    target.write_text("old")
    target.chmod(0o600)
    atomic_write(target, "new")
    assert target.read_text() == "new" and stat.S_IMODE(target.stat().st_mode) == 0o600


def test_read_bounded_never_blocks_on_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)  # nobody writes: a blocking open or read would wait forever
    started = time.monotonic()
    with deadline(10), pytest.raises(UnsafeFile, match=r"\(a FIFO\)"):
        read_bounded(fifo, 1 << 20)
    assert time.monotonic() - started < 5
    _is(fifo, stat.S_ISFIFO)


@pytest.mark.parametrize("follow", [False, True])
def test_read_bounded_refuses_a_link_to_dev_zero(follow: bool, tmp_path: Path) -> None:
    link = tmp_path / "zero"
    link.symlink_to("/dev/zero")
    words = "a character device" if follow else "a symbolic link"
    with memory_cap(1 << 30), pytest.raises(UnsafeFile, match=re.escape(f"({words})")):
        read_bounded(link, 1 << 20, follow_symlinks=follow)


def test_read_bounded_refuses_more_than_its_limit(tmp_path: Path) -> None:
    path = tmp_path / "big"
    path.write_bytes(b"x" * 101)
    assert read_bounded(path, 101) == b"x" * 101
    with pytest.raises(UnsafeFile, match="101 bytes, over 100 bytes; refused"):
        read_bounded(path, 100)
    sparse = tmp_path / "sparse"
    with sparse.open("wb") as f:
        f.truncate(4 << 30)  # 4 GiB without a byte on disk: refused before reading
    with memory_cap(1 << 30), pytest.raises(UnsafeFile, match="4096 MiB, over 64 MiB"):
        read_bounded(sparse, 64 << 20)


def test_private_dir_is_0700_and_refuses_a_link(tmp_path: Path) -> None:
    old = os.umask(0)  # the folder is 0700 by choice, not by the umask
    try:
        made = private_dir(tmp_path / "a" / "b")
    finally:
        os.umask(old)
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700  # missing parents too
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o775)
    assert private_dir(shared) == shared  # an existing folder keeps its mode (a team store)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o775
    link = tmp_path / "link"
    link.symlink_to(shared)
    with pytest.raises(UnsafeFile, match=re.escape(f"{link}: not a folder (a symbolic link)")):
        private_dir(link)


# -- the decision store -------------------------------------------------------------------------


@pytest.fixture(params=["unsigned", "signed"])
def signing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every store test with and without CHAIN_MEMORY_KEY."""
    if request.param == "signed":
        monkeypatch.setenv("CHAIN_MEMORY_KEY", "fleet-secret")
    else:
        monkeypatch.delenv("CHAIN_MEMORY_KEY", raising=False)
    return str(request.param)


def _entry(store: Path) -> Path:
    """The one entry a first run left in `store`."""
    [path] = store.glob("*.json")
    return path


def test_a_symlink_at_an_entry_is_refused_and_its_target_kept(signing: str, tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = _mlp_run(chain("eager", store=store, memory=True))
    assert first.winner == "eager"
    entry = _entry(store)
    victim = _victim(tmp_path)
    entry.unlink()
    entry.symlink_to(victim)
    with pytest.warns(MemoryWarning, match=r"not a regular file \(a symbolic link\)"):
        record = _mlp_run(chain("eager", store=store, memory=True))
    _cold_start(record, "a symbolic link")
    _intact(victim)
    _is_link(entry, victim)
    _no_temporaries(store)


def test_a_dangling_symlink_at_an_entry_creates_nothing(signing: str, tmp_path: Path) -> None:
    """The old store read a dangling link as a miss, then wrote its decision through it."""
    store = tmp_path / "store"
    _mlp_run(chain("eager", store=store, memory=True))
    entry = _entry(store)
    entry.unlink()
    absent = tmp_path / "made-through-the-link.json"
    entry.symlink_to(absent)
    with pytest.warns(MemoryWarning, match=r"a symbolic link"):
        record = _mlp_run(chain("eager", store=store, memory=True))
    _cold_start(record, "a symbolic link")
    _absent(absent)
    _is_link(entry, absent)


def test_a_fifo_at_an_entry_is_a_quick_cold_start(signing: str, tmp_path: Path) -> None:
    store = tmp_path / "store"
    _mlp_run(chain("eager", store=store, memory=True))
    entry = _entry(store)
    entry.unlink()
    os.mkfifo(entry)  # nobody ever writes: the old store's read never returned
    with deadline(10), pytest.raises(StoreUnavailable, match=r"\(a FIFO\)"):
        LocalStore(store).get(entry.stem)
    with deadline(300), pytest.warns(MemoryWarning, match=r"\(a FIFO\)"):
        record = _mlp_run(chain("eager", store=store, memory=True))
    _cold_start(record, "a FIFO")
    _is(entry, stat.S_ISFIFO)


def test_a_link_to_dev_zero_at_an_entry_or_artefact_is_refused(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    store.put(KEY, b"{}")
    for where in (store, store.artefacts()):
        private_dir(where.directory)
        path = where.directory / f"{KEY}{where.suffix}"
        path.unlink(missing_ok=True)
        path.symlink_to("/dev/zero")
        with memory_cap(1 << 30), pytest.raises(StoreUnavailable, match=r"a symbolic link"):
            where.get(KEY)
        _is_link(path, Path("/dev/zero"))


def test_an_entry_over_the_limit_is_refused_unread(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    store.put(KEY, b"{}")
    with (tmp_path / "store" / f"{KEY}.json").open("r+b") as f:
        f.truncate(LocalStore.ENTRY_MAX_BYTES + 1)  # sparse: no disk used
    with memory_cap(1 << 30), pytest.raises(StoreUnavailable, match="over 64 MiB; refused"):
        store.get(KEY)
    small = LocalStore(tmp_path / "small", max_bytes=10)
    small.put(KEY, b"x" * 11)
    with pytest.raises(StoreUnavailable, match="11 bytes, over 10 bytes"):
        small.get(KEY)


@pytest.mark.parametrize("kind", ["symlink", "dangling symlink", "fifo", "directory"])
def test_a_store_write_refuses_what_is_planted(kind: str, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    private_dir(store.directory)
    path = store.directory / f"{KEY}.json"
    still_there = _plant(kind, path, tmp_path)
    with pytest.raises(StoreUnavailable, match=re.escape(f"({WORDS[kind]})")):
        store.put(KEY, b"{}")
    still_there()
    _no_temporaries(store.directory)


def test_the_store_folder_is_private_to_its_user(tmp_path: Path) -> None:
    store = tmp_path / "cache" / "decisions"
    old = os.umask(0)  # the umask would allow everyone in: the folder is 0700 all the same
    try:
        record = _mlp_run(chain("eager", store=store, memory=True))
    finally:
        os.umask(old)
    assert record.winner == "eager"
    assert stat.S_IMODE(store.stat().st_mode) == 0o700
    assert stat.S_IMODE(store.parent.stat().st_mode) == 0o700
    assert len(list(store.glob("*.json"))) == 1


def test_a_symlinked_store_folder_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "elsewhere"
    real.mkdir()
    link = tmp_path / "decisions"
    link.symlink_to(real)
    with pytest.raises(StoreUnavailable, match=re.escape(f"{link}: not a folder")):
        LocalStore(link).put(KEY, b"{}")
    assert list(real.iterdir()) == []


@pytest.fixture
def ort() -> None:
    pytest.importorskip("onnxruntime")


def _ort_chain(store: Path) -> Any:
    """ONNX Runtime first, no eager floor: it wins whenever it passes (it stores artefacts)."""
    return chain("onnxruntime", "eager", eager_floor=False, store=store, memory=True)


def _artefact(store: Path) -> Path:
    [path] = (store / "artefacts").glob("*.bin")
    return path


def test_a_symlink_at_an_artefact_is_refused_and_its_target_kept(
    ort: None, signing: str, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    assert _mlp_run(_ort_chain(store)).winner == "onnxruntime"
    artefact = _artefact(store)
    assert stat.S_IMODE(artefact.parent.stat().st_mode) == 0o700
    victim = _victim(tmp_path)
    artefact.unlink()
    artefact.symlink_to(victim)
    with pytest.warns(MemoryWarning, match=r"not a regular file \(a symbolic link\)"):
        record = _mlp_run(_ort_chain(store))
    assert record.winner == "onnxruntime"
    assert not any("built from its stored artefact" in n for n in record.notes), record.notes
    _intact(victim)
    _is_link(artefact, victim)


def test_an_artefact_is_never_written_through_a_planted_link(
    ort: None, signing: str, tmp_path: Path
) -> None:
    """A link planted before the artefact is first written (a miss, then a store)."""
    store = tmp_path / "store"
    _mlp_run(_ort_chain(store))
    artefact = _artefact(store)
    _entry(store).unlink()  # a miss next time: the chain selects, then stores both files
    artefact.unlink()
    victim = _victim(tmp_path)
    artefact.symlink_to(victim)
    with pytest.warns(MemoryWarning, match=r"a symbolic link"):
        record = _mlp_run(_ort_chain(store))
    assert record.winner == "onnxruntime"
    _intact(victim)
    _is_link(artefact, victim)
    _no_temporaries(artefact.parent)


# -- reports ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory", "device"])
def test_chain_report_env_refuses_what_is_planted(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "run.json"
    still_there = _plant(kind, path, tmp_path)
    monkeypatch.setenv("CHAIN_REPORT", str(path))
    with caplog.at_level(logging.WARNING, logger="chain"), deadline(300):
        record = _mlp_run(chain("eager", measure=False))
    assert record.winner == "eager"  # the model ran, right: a report never fails the call
    warned = [r.getMessage() for r in caplog.records if r.name == "chain"]
    assert any(
        "report not written" in w and f"{path}: not a regular file ({WORDS[kind]})" in w
        for w in warned
    ), warned
    still_there()
    _no_temporaries(tmp_path)


@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory", "device"])
def test_save_html_refuses_what_is_planted(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "page.html"
    still_there = _plant(kind, path, tmp_path)
    with pytest.raises(UnsafeFile, match=re.escape(f"({WORDS[kind]})")):
        html.save(_one_graph_report(), path)
    with pytest.raises(UnsafeFile):
        _one_graph_report().save_html(path)
    with pytest.raises(UnsafeFile):
        _one_graph_report().save(path)
    still_there()
    _no_temporaries(tmp_path)


def _cli_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CHAIN_REPORT"}
    return {**env, "CHAIN_MEMORY": "0", "PYTHONPATH": str(ROOT)}


def _one_line_error(done: subprocess.CompletedProcess[str], expected: str) -> None:
    assert done.returncode == 2, (done.stdout[-500:], done.stderr[-2000:])
    assert done.stdout == ""
    assert done.stderr.splitlines() == [f"chain: error: {expected}"], done.stderr[-2000:]


PLANTED_AT_O = ["directory", "fifo", "device", "symlink"]


class CliRun:
    """One `chain report` command of the batch below: its folder, output path, the check
    that what was planted there is unchanged (None: nothing planted), the run, or the
    reason it could not be set up (a skip)."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.out = folder, folder / "page.html"
        self.kept: Callable[[], None] | None = None
        self.skip: str | None = None
        self.done: subprocess.CompletedProcess[str] | None = None


@pytest.fixture(scope="module")
def report_cli(tmp_path_factory: pytest.TempPathFactory) -> dict[str, CliRun]:
    """`chain report` with a folder, FIFO, device or link planted at `-o`, on a folder, and
    to a plain `-o`: all in one fresh process (tests/helpers.py cli_runs; a blocked write
    hangs it, and the timeout fails every case), each planted thing checked afterwards."""
    runs: dict[str, CliRun] = {}
    argv: dict[str, list[str]] = {}
    for kind in [*PLANTED_AT_O, "plain"]:
        run = runs[kind] = CliRun(tmp_path_factory.mktemp(kind.replace(" ", "_")))
        report = run.folder / "run.json"
        _one_graph_report().save(report)
        if kind != "plain":
            try:
                run.kept = _plant(kind, run.out, run.folder)
            except pytest.skip.Exception as e:
                run.skip = str(e)
                continue
        argv[kind] = ["report", str(report), "--format", "html", "-o", str(run.out)]
    runs["of a directory"] = CliRun(tmp_path_factory.mktemp("a_directory"))
    argv["of a directory"] = ["report", str(runs["of a directory"].folder)]
    for kind, done in zip(argv, cli_runs(*argv.values(), env=_cli_env(), timeout=300), strict=True):
        runs[kind].done = done
    return runs


def _ran(run: CliRun) -> subprocess.CompletedProcess[str]:
    if run.skip is not None:
        pytest.skip(run.skip)
    assert run.done is not None
    return run.done


@pytest.mark.parametrize("kind", PLANTED_AT_O)
def test_chain_report_o_refuses_what_is_planted(kind: str, report_cli: dict[str, CliRun]) -> None:
    run = report_cli[kind]
    done = _ran(run)
    _one_line_error(done, f"{run.out}: not a regular file ({WORDS[kind]})")
    assert run.kept is not None
    run.kept()
    _no_temporaries(run.folder)


def test_chain_report_of_a_directory_is_one_line(report_cli: dict[str, CliRun]) -> None:
    run = report_cli["of a directory"]
    _one_line_error(_ran(run), f"{run.folder}: not a regular file (a directory)")


def test_chain_report_o_writes_a_regular_file(report_cli: dict[str, CliRun]) -> None:
    """The same command to a plain path works: the refusals above are about the target."""
    run = report_cli["plain"]
    done = _ran(run)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == f"wrote {run.out}"
    assert run.out.read_text().startswith("<!DOCTYPE html>")


# -- the TensorRT engine cache (its files only: runs without TensorRT) --------------------------


def test_engine_cache_refuses_links_and_fifos_and_is_private(tmp_path: Path) -> None:
    from backends.tensorrt.conversion.cache import EngineCache

    cache = EngineCache(tmp_path / "trt")
    cache.store("a" * 64, b"engine-bytes", {"inputs": ["x"], "outputs": ["y"]})
    engines = tmp_path / "trt" / "engines"
    assert stat.S_IMODE(engines.stat().st_mode) == 0o700
    engine, meta = engines / ("a" * 64 + ".engine"), engines / ("a" * 64 + ".json")
    engine.unlink()
    victim = _victim(tmp_path)
    engine.symlink_to(victim)
    with pytest.warns(RuntimeWarning, match=r"ignoring .* \(a symbolic link\)"):
        assert cache.load("a" * 64) is None  # a miss: the engine is rebuilt
    with pytest.warns(RuntimeWarning, match=r"not cached: .* \(a symbolic link\)"):
        cache.store("a" * 64, b"rebuilt", {"inputs": ["x"], "outputs": ["y"]})
    _intact(victim)
    _is_link(engine, victim)
    meta.unlink()
    os.mkfifo(meta)  # nobody writes: reading it must not wait
    with deadline(10), pytest.warns(RuntimeWarning, match=r"\(a FIFO\)"):
        assert cache.load("a" * 64) is None
    _is(meta, stat.S_ISFIFO)
    timing = tmp_path / "trt" / "timing.cache"
    timing.symlink_to("/dev/zero")
    with memory_cap(1 << 30), pytest.warns(RuntimeWarning, match=r"\(a symbolic link\)"):
        assert cache.read_timing_cache() == b""
    with pytest.warns(RuntimeWarning, match=r"timing cache not saved: .* \(a symbolic link\)"):
        cache.write_timing_cache(b"tactics")
    _is_link(timing, Path("/dev/zero"))
