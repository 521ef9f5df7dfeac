"""Atomic file writes: readers see the old file or the new one, never half of one.

Used by the report, the TensorRT engine cache and the benchmark's outputs. A path that is
a symlink is written through: its final target is replaced (atomically, beside it) and
the link stays a link, as `open(path, "w")` would leave it. An existing file keeps its
permission bits (a 0600 file stays 0600).
"""

from __future__ import annotations

import contextlib
import os
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path


def written_path(path: str | os.PathLike[str]) -> Path:
    """The file a write to `path` replaces: `path`, or for a symlink its final target."""
    target = Path(path)
    return Path(os.path.realpath(target)) if target.is_symlink() else target


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A fresh temporary path beside `path` to write to; renamed over `path` on success.

    On any failure (the writer's or the rename's) the temporary file is removed and the
    old `path` is left as it was. The temporary name ends in `.tmp`: a writer that infers
    the format from the suffix must be told it.
    """
    target = written_path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write(path: str | os.PathLike[str], data: bytes | str) -> Path:
    """Write `data` (text as UTF-8) to `path` atomically and durably; returns the path.

    A new file gets the usual permissions (0666 less the umask, as `open()` gives; a
    `tempfile.mkstemp` file would be 0600); an existing one keeps its own. The folder
    must exist.
    """
    payload = data.encode() if isinstance(data, str) else data
    try:
        mode: int | None = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        mode = None
    with atomic_path(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
    return Path(path)
