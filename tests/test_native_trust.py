"""Native artefacts are trusted on what is opened (issue 44, item 2): the store's folders
from `/` down are opened no-follow and `fstat`ed, the file is read from its checked folder's
descriptor. A folder swapped in a loop by a thread never gets its bytes accepted; a
world-writable ancestor is refused, a sticky one (as /tmp) is not; a vanished file is not
trusted; a TensorRT engine cache follows the same rule."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import torch
from torch import fx

import chain.memory.artefacts as artefacts
from backends.registry import Artefact
from chain.memory import LocalStore
from chain.memory.remember import Memory, Recall

KEY = "ab" * 16
GOOD, EVIL = b"the user's own package", b"someone else's native code"


def _graph() -> tuple[fx.GraphModule, list[torch.Tensor]]:
    return fx.symbolic_trace(torch.nn.ReLU()), [torch.randn(2, 3)]


def _stored(folder: Path, data: bytes, mode: int) -> None:
    """A store at `folder` holding `data` as the artefact under KEY, folders of `mode`."""
    gm, inputs = _graph()
    weights, _ = artefacts.weights_digest(gm, inputs, ())
    store = LocalStore(folder)
    store.artefacts().put(KEY, artefacts.encode(KEY, "inductor", Artefact(data, ()), weights))
    for path in (folder, folder / "artefacts"):
        path.chmod(mode)


def _load(memory: Memory) -> tuple[bytes | None, str | None]:
    gm, inputs = _graph()
    return memory.artefact(Recall(KEY, {}, None), "inductor", gm, inputs, native=True)


@pytest.fixture
def unsigned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHAIN_MEMORY_KEY", raising=False)


def test_a_folder_swapped_in_a_loop_never_has_its_bytes_accepted(
    tmp_path: Path, unsigned: None
) -> None:
    # the store's folder `s/decisions` and a world-writable look-alike swap names, over and
    # over, while the warm start reads: each read is the user's bytes or a refusal
    base = tmp_path / "base"
    base.mkdir(mode=0o700)
    (base / "s").mkdir(mode=0o700)
    (base / "evil").mkdir(mode=0o700)
    _stored(base / "s" / "decisions", GOOD, 0o700)
    _stored(base / "evil" / "decisions", EVIL, 0o777)
    memory = Memory(str(base / "s" / "decisions"), {})
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            os.rename(base / "s", base / "tmp")
            os.rename(base / "evil", base / "s")
            os.rename(base / "tmp", base / "evil")

    swapper = threading.Thread(target=swap)
    swapper.start()
    got: list[bytes | None] = []
    try:
        with pytest.warns() as _:
            for _ in range(2000):
                got.append(_load(memory)[0])
    finally:
        stop.set()
        swapper.join()
    assert got.count(EVIL) == 0
    assert got.count(GOOD) > 0  # not a check that refuses everything
    assert set(got) <= {GOOD, EVIL, None}


def test_ancestors_writable_by_others_are_refused_sticky_ones_are_not(
    tmp_path: Path, unsigned: None
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    _stored(shared / "decisions", GOOD, 0o700)
    memory = Memory(str(shared / "decisions"), {})
    shared.chmod(0o777)  # anyone may rename the store's folder away
    with pytest.warns(UserWarning, match="writable by group and others"):
        data, note = _load(memory)
    assert data is None and note is not None and str(shared) in note
    shared.chmod(0o1777)  # sticky, as /tmp: others cannot move what the user owns there
    assert _load(memory) == (GOOD, None)


def test_a_symlinked_store_is_checked_where_it_leads(tmp_path: Path, unsigned: None) -> None:
    real = tmp_path / "real"
    real.mkdir()
    _stored(real / "decisions", GOOD, 0o700)
    (tmp_path / "link").symlink_to(real)
    assert _load(Memory(str(tmp_path / "link" / "decisions"), {})) == (GOOD, None)
    (real / "decisions").chmod(0o777)
    with pytest.warns(UserWarning, match="writable by"):
        data, _ = _load(Memory(str(tmp_path / "link" / "decisions"), {}))
    assert data is None


def test_a_vanished_file_is_not_trusted(tmp_path: Path, unsigned: None) -> None:
    _stored(tmp_path / "decisions", GOOD, 0o700)
    (tmp_path / "decisions" / "artefacts" / f"{KEY}.bin").unlink()
    assert _load(Memory(str(tmp_path / "decisions"), {})) == (None, None)
    from backends.common.trusted import read_trusted

    with pytest.raises(FileNotFoundError):
        read_trusted(tmp_path / "decisions" / "artefacts" / f"{KEY}.bin", 1 << 20)


def test_a_file_others_may_write_is_refused_when_they_may_enter(tmp_path: Path) -> None:
    from backends.common.trusted import Untrusted, read_trusted

    folder = tmp_path / "f"
    folder.mkdir(mode=0o700)
    file = folder / "x.bin"
    file.write_bytes(GOOD)
    file.chmod(0o666)
    assert read_trusted(file, 100) == GOOD  # a 0700 folder: no one else can open it
    folder.chmod(0o755)
    with pytest.raises(Untrusted, match="writable by group and others"):
        read_trusted(file, 100)


def test_a_tensorrt_engine_cache_others_can_write_is_a_miss(tmp_path: Path) -> None:
    from backends.tensorrt.conversion.cache import EngineCache

    cache = EngineCache(tmp_path / "trt")
    cache.store("k" * 16, b"engine bytes", {"inputs": []})
    assert cache.load("k" * 16) is not None
    (tmp_path / "trt" / "engines").chmod(0o777)
    with pytest.warns(RuntimeWarning, match="writable by"):
        assert cache.load("k" * 16) is None
