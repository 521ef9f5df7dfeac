"""Native code read only from what was checked: trust decided on opened file descriptors.

A native artefact (an inductor package, a TensorRT engine) runs as the user once loaded, so
the folders it comes from must be ones only the user (or root) can change. Checking paths
by name before or after a read leaves a window: whoever can write a parent folder swaps
folders between the check and the read. Here every folder from `/` down is opened with
O_NOFOLLOW | O_DIRECTORY relative to the one above (a symlink met on the way is checked as
an entry of its checked folder, then followed by walking its target the same way) and
`fstat`ed: owned by the user or root, and writable by no one else unless sticky (as /tmp:
others cannot rename what the user owns there). The folders at and below the `root` the
caller names (the store, its artefact folder) must be the user's own and private. The file
is then opened relative to its checked folder's descriptor with O_NOFOLLOW, `fstat`ed
(regular, the user's, not writable by others) and read from that same descriptor. A file
that vanished is FileNotFoundError: never trusted.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from backends.common.files import UnsafeFile, _read_all, not_regular

_DIR_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_DIRECTORY", 0)
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)
_FILE_FLAGS = (
    os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
)
_MAX_LINKS = 40  # as the kernel's own limit on symlinks in one lookup
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


class Untrusted(UnsafeFile):
    """A native artefact whose folders or file someone else could change: not loaded."""


def _me() -> int:
    return os.getuid() if hasattr(os, "getuid") else 0


def _why_folder(info: os.stat_result, where: str, own: bool) -> str | None:
    """Why the folder `where` (its fstat `info`) could be changed by someone else. `own`:
    it is the artefact's own folder (the user's, private), else an ancestor (the user's or
    root's, writable by others only when sticky)."""
    if not stat.S_ISDIR(info.st_mode):
        return f"{where} is not a folder"
    owners = (_me(),) if own else (_me(), 0)
    if info.st_uid not in owners:
        return f"{where} is owned by uid {info.st_uid}, not this user ({_me()}) or root"
    mode = stat.S_IMODE(info.st_mode)
    if mode & _OTHERS_WRITE and (own or not mode & stat.S_ISVTX):
        return f"{where} is writable by {_who(mode)} (mode {mode:04o})"
    return None


def _walk(parts: list[str], fd: int, where: str, own_from: int, links: list[int]) -> int:
    """The checked descriptor of the folder `parts` below `fd` (a checked folder); each
    step opened relative to the last one, no-follow, and `fstat`ed. A symlink is followed
    by walking its target (checked as well). The caller closes the returned descriptor."""
    for depth, name in enumerate(parts):
        if name in ("", "."):
            continue
        if name == "..":
            raise Untrusted(f"{where}/..: a path to native code never climbs")
        try:
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as error:
                if error.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                child = _follow(fd, name, f"{where}/{name}", links)
        finally:
            os.close(fd)
        fd = child
        where = f"{where.rstrip('/')}/{name}"
        why = _why_folder(os.fstat(fd), where, own=depth >= own_from)
        if why is not None:
            os.close(fd)
            raise Untrusted(why)
    return fd


def _follow(fd: int, name: str, where: str, links: list[int]) -> int:
    """The checked descriptor of the folder the symlink `name` in the checked folder `fd`
    points to: the link is the user's or root's (others cannot change it: its folder was
    checked), and its target is walked from `/` or from `fd`."""
    info = os.stat(name, dir_fd=fd, follow_symlinks=False)
    if not stat.S_ISLNK(info.st_mode):
        raise Untrusted(f"{where} is not a folder")
    if info.st_uid not in (_me(), 0):
        raise Untrusted(f"{where} is a symbolic link owned by uid {info.st_uid}")
    links.append(1)
    if len(links) > _MAX_LINKS:
        raise Untrusted(f"{where}: too many symbolic links")
    target = os.readlink(name, dir_fd=fd)
    if os.path.isabs(target):
        start = os.open("/", _DIR_FLAGS)
        return _walk(_resolved(target), start, "", 1 << 30, links)
    return _walk(target.split("/"), os.dup(fd), where.rsplit("/", 1)[0], 1 << 30, links)


def _resolved(path: str) -> list[str]:
    """The components of an absolute path, `..` folded lexically (a target of a link)."""
    parts: list[str] = []
    for name in path.split("/"):
        if name == "..":
            if parts:
                parts.pop()
        elif name not in ("", "."):
            parts.append(name)
    return parts


def open_folder(folder: str | os.PathLike[str], root: str | os.PathLike[str]) -> int:
    """A descriptor of `folder`, checked from `/` down: every ancestor of `root` the user's
    or root's and not writable by others unless sticky; `root` and the folders below it up
    to `folder` the user's and private. Untrusted (an UnsafeFile) says which is not."""
    path, top = Path(os.path.abspath(folder)), Path(os.path.abspath(root))
    if path != top and top not in path.parents:
        raise Untrusted(f"{path} is not inside {top}")
    parts = _resolved(str(path))
    own_from = len(_resolved(str(top))) - 1
    fd = os.open("/", _DIR_FLAGS)
    why = _why_folder(os.fstat(fd), "/", own=own_from < 0)
    if why is not None:
        os.close(fd)
        raise Untrusted(why)
    return _walk(parts, fd, "", own_from, [])


def _who(mode: int) -> str:
    bits = ((stat.S_IWGRP, "group"), (stat.S_IWOTH, "others"))
    return " and ".join(w for bit, w in bits if mode & bit)


def open_trusted(path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None) -> int:
    """A descriptor of the native artefact `path`, opened relative to its checked folder
    (see the module doc; `root`: the highest folder that must be the user's own, default
    the file's folder) and checked itself. Untrusted when someone else could have changed
    it, UnsafeFile when it is not a regular file, FileNotFoundError when it is gone."""
    file = Path(os.path.abspath(path))
    folder = open_folder(file.parent, root if root is not None else file.parent)
    try:
        try:
            fd = os.open(file.name, _FILE_FLAGS, dir_fd=folder)
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise Untrusted(f"{file}: not a regular file (a symbolic link)") from None
            raise
        shared = bool(os.fstat(folder).st_mode & (stat.S_IXGRP | stat.S_IXOTH))
    finally:
        os.close(folder)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise not_regular(file, info.st_mode)
        if info.st_uid != _me():
            raise Untrusted(f"{file} is owned by uid {info.st_uid}, not this user ({_me()})")
        mode = stat.S_IMODE(info.st_mode)
        if shared and mode & _OTHERS_WRITE:
            raise Untrusted(f"{file} is writable by {_who(mode)} (mode {mode:04o})")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_trusted(
    path: str | os.PathLike[str], limit_bytes: int, root: str | os.PathLike[str] | None = None
) -> bytes:
    """The bytes of the native artefact `path` (`open_trusted`), read from the descriptor
    that was checked; UnsafeFile too when it is over `limit_bytes`."""
    fd = open_trusted(path, root)
    try:
        if os.fstat(fd).st_size > limit_bytes:
            raise UnsafeFile(f"{os.fspath(path)}: over {limit_bytes} bytes; refused")
        return _read_all(fd, limit_bytes, path)
    finally:
        os.close(fd)


def why_untrusted_path(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> str | None:
    """Why the native artefact `path` could be changed by someone else (`open_trusted`'s
    rule), in advance; None when it could not, or it (or its folder) does not exist yet
    (the store makes them private). A load decides again on what it opens."""
    try:
        os.close(open_trusted(path, root))
    except FileNotFoundError:
        return None
    except OSError as error:  # Untrusted included: its text names the folder
        return str(error) if isinstance(error, UnsafeFile) else f"{path}: {error}"
    return None
