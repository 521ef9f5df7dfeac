"""Atomic writes: the old file or the new one, never half; no temporary file left behind."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from backends.common.files import atomic_path, atomic_write


def test_atomic_write_replaces_text_and_bytes(tmp_path: Path) -> None:
    target = tmp_path / "f.json"
    assert atomic_write(target, "ü") == target
    assert target.read_bytes() == "ü".encode()
    atomic_write(target, b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01"
    assert list(tmp_path.iterdir()) == [target]


def test_a_failed_writer_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "chart.png"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="drawing failed"), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("drawing failed")
    assert target.read_text() == "old"
    assert list(tmp_path.iterdir()) == [target]


def test_a_failed_rename_leaves_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "engine"
    target.write_bytes(b"old")

    def crash(*_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("os.replace", crash)
    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, b"new")
    assert target.read_bytes() == b"old"
    assert list(tmp_path.iterdir()) == [target]


def test_new_files_get_the_umask_permissions(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        path = atomic_write(tmp_path / "f", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
