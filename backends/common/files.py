"""The one file layer: everything the library writes or reads goes through here.

Writes are atomic (readers see the old file or the new one, never half of one) and go
only to regular files: a temporary file is created exclusively (O_EXCL, no-follow) beside
the target and renamed over it. A target that is a symlink, a FIFO, a device, a socket or
a directory is refused with `UnsafeFile` (an OSError, so callers that turn OSError into a
warning keep doing so): a link planted in a shared folder never redirects a write, and a
device node or FIFO is never replaced by a regular file. An existing file keeps its
permission bits (a 0600 file stays 0600).

Reads (`read_bounded`) open without following a symlink and without blocking, check the
opened descriptor (a FIFO or `/dev/zero` is refused before a byte is read) and refuse more
than a stated number of bytes. `private_dir` makes folders only their owner can enter;
`private_file` puts bytes where only their owner can read them, for as long as a block runs
(a native library handed to a loader).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_TRIES = 8  # fresh temporary names tried before giving up (a clash means a planted file)


class UnsafeFile(OSError):
    """A path the library refuses to read or write: not a regular file, or too large."""


def kind(mode: int) -> str:
    """What a file of `mode` is, in words ("a FIFO"), for a refusal."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((name for test, name in _KINDS if test(mode)), "not a file")


def not_regular(path: str | os.PathLike[str], mode: int) -> UnsafeFile:
    """The one-line refusal of the non-regular file `path` of `mode`."""
    return UnsafeFile(f"{os.fspath(path)}: not a regular file ({kind(mode)})")


def existing_mode(path: str | os.PathLike[str]) -> int | None:
    """The permission bits of the regular file at `path`; None when nothing is there.

    Checked without following a symlink: anything but a regular file is UnsafeFile.
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode):
        raise not_regular(path, info.st_mode)
    return stat.S_IMODE(info.st_mode)


def written_path(path: str | os.PathLike[str]) -> Path:
    """The file a write to `path` replaces: `path` itself (UnsafeFile if not a regular file).

    Kept for callers of the old API, which followed symlinks: links are refused now.
    """
    existing_mode(path)
    return Path(path)


def _exclusive_temp(target: Path, mode: int | None) -> tuple[Path, int]:
    """A new empty file beside `target`, created exclusively and opened for writing.

    O_EXCL with O_NOFOLLOW: a file or link planted at the temporary name is never opened.
    `mode`: the bits to give it (the replaced file's); None keeps open()'s (0666 less umask).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
    for _ in range(_TRIES):
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp")
        try:
            fd = os.open(tmp, flags, 0o666)
        except FileExistsError:
            continue
        try:
            if mode is not None:
                os.fchmod(fd, mode)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        return tmp, fd
    raise UnsafeFile(f"{target}: no free temporary name beside it after {_TRIES} tries")


def _replace(tmp: Path, target: Path) -> None:
    """Rename `tmp` over `target`, both checked again just before (neither may have become
    a link, FIFO or device since). A rename never writes through a link at `target`."""
    info = os.lstat(tmp)
    if not stat.S_ISREG(info.st_mode):
        raise not_regular(tmp, info.st_mode)
    existing_mode(target)
    os.replace(tmp, target)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A fresh, empty temporary file beside `path` to write to; renamed over `path` on success.

    `path` must be missing or a regular file (else UnsafeFile, before anything is written).
    On any failure (the writer's or the rename's) the temporary file is removed and the
    old `path` is left as it was. The temporary name ends in `.tmp`: a writer that infers
    the format from the suffix must be told it.
    """
    target = Path(path)
    tmp, fd = _exclusive_temp(target, existing_mode(target))
    os.close(fd)
    try:
        yield tmp
        _replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write(path: str | os.PathLike[str], data: bytes | str) -> Path:
    """Write `data` (text as UTF-8) to `path` atomically and durably; returns the path.

    `path` must be missing or a regular file (else UnsafeFile). A new file gets the usual
    permissions (0666 less the umask, as `open()` gives); an existing one keeps its own.
    The folder must exist.
    """
    payload = data.encode() if isinstance(data, str) else data
    target = Path(path)
    tmp, fd = _exclusive_temp(target, existing_mode(target))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        _replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def _read_all(fd: int, limit_bytes: int, path: str | os.PathLike[str]) -> bytes:
    """Up to `limit_bytes` from `fd`; UnsafeFile if there is more (a file growing as read)."""
    chunks: list[bytes] = []
    size = 0
    while chunk := os.read(fd, min(1 << 20, limit_bytes + 1 - size)):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit_bytes:
            raise UnsafeFile(f"{os.fspath(path)}: over {_amount(limit_bytes)}; refused")
    return b"".join(chunks)


def _amount(n: int) -> str:
    """A byte count in words: "64 MiB", "512 bytes"."""
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n} bytes"


def read_bounded(
    path: str | os.PathLike[str], limit_bytes: int, *, follow_symlinks: bool = False
) -> bytes:
    """The bytes of the regular file `path`, at most `limit_bytes` of them.

    Opened with O_NONBLOCK (and O_NOFOLLOW unless `follow_symlinks`) and checked on the open
    descriptor: a symlink, FIFO, device, socket or directory is UnsafeFile before a byte is
    read (a FIFO never blocks, `/dev/zero` never fills memory), and so is a file over the
    limit. A missing file is FileNotFoundError; other failures are OSError as raised.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | _CLOEXEC | (0 if follow_symlinks else _NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow_symlinks:
            raise UnsafeFile(f"{os.fspath(path)}: not a regular file (a symbolic link)") from None
        if e.errno == errno.ENXIO:  # a socket, or a device with no driver
            raise not_regular(path, os.stat(path).st_mode) from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise not_regular(path, info.st_mode)
        if info.st_size > limit_bytes:
            raise UnsafeFile(
                f"{os.fspath(path)}: {_amount(info.st_size)}, over {_amount(limit_bytes)}; refused"
            )
        return _read_all(fd, limit_bytes, path)
    finally:
        os.close(fd)


def not_a_dir(path: str | os.PathLike[str], mode: int) -> UnsafeFile:
    """The one-line refusal of `path` where a folder was wanted."""
    return UnsafeFile(f"{os.fspath(path)}: not a folder ({kind(mode)})")


def _make_private(folder: Path) -> None:
    """Create `folder` with mode 0700 exactly (whatever the umask), unless it appeared
    meanwhile; the mode is set on the opened folder, never through a link."""
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:  # made by another process meanwhile: checked by the caller
        return
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW | _CLOEXEC)
    try:
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def private_dir(path: str | os.PathLike[str]) -> Path:
    """The folder `path`, created with mode 0700 (and so are missing parents) if missing.

    An existing folder is used as it is (a shared store keeps its mode); an existing path
    that is a symlink or not a folder is UnsafeFile.
    """
    folder = Path(path)
    missing: list[Path] = []
    for p in (folder, *folder.parents):
        if not os.path.lexists(p):
            missing.append(p)
            continue
        break
    for p in reversed(missing):
        _make_private(p)
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode):
        raise not_a_dir(folder, info.st_mode)
    return folder


@contextlib.contextmanager
def private_file(data: bytes, name: str = "data") -> Iterator[str]:
    """`data` in a new file only this user can read (0600, created exclusively, no-follow)
    in a new folder only this user can enter (0700, `mkdtemp`); both removed after the block.
    For bytes that a loader must open by path (a shared library), once they are checked."""
    folder = tempfile.mkdtemp(prefix="chain-private-")
    try:
        path = os.path.join(folder, name)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
        with os.fdopen(os.open(path, flags, 0o600), "wb") as f:
            f.write(data)
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)
