"""Whether a store may hand over artefacts that hold native code (inductor's packages):
loading one runs it, so a hostile file there is code run as the user.

Such an artefact loads only when it is signed under CHAIN_MEMORY_KEY (the store checked
the HMAC), or when it comes from a local folder store that only this user can change: the
store's folder, its artefact folder and the artefact file owned by this user, the folders
writable by no one else (no group or other write bit), and the file too where others may
enter its folder. A Redis store, or a folder others can write to, needs the key.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from chain.memory.entry import SIGNING_KEY_ENV, signing_key
from chain.memory.stores import LocalStore, Store


def _owned_and_private(path: Path, reachable: bool = True) -> str | None:
    """Why `path` could be changed by someone else (None: only this user can). `reachable`:
    others can enter its folder (a file in a 0700 folder cannot be opened by them, whatever
    its own bits: a umask of 002 leaves files group-writable)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:  # not made yet: the store makes it private to this user
        return None
    except OSError as error:
        return f"{path} cannot be checked ({error.strerror or error})"
    if stat.S_ISLNK(info.st_mode):
        return f"{path} is a symbolic link"
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        return f"{path} is owned by uid {info.st_uid}, not this user ({os.getuid()})"
    mode = stat.S_IMODE(info.st_mode)
    if reachable and mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = " and ".join(
            w for bit, w in ((stat.S_IWGRP, "group"), (stat.S_IWOTH, "others")) if mode & bit
        )
        return f"{path} is writable by {who} (mode {mode:04o})"
    return None


def why_untrusted(store: Store, key: str) -> str | None:
    """Why the artefact under `key` in `store` may not be loaded as native code (None: it
    may). The signature, when CHAIN_MEMORY_KEY is set, was checked when it was read."""
    if signing_key() is not None:
        return None
    unsigned = f"not signed (no {SIGNING_KEY_ENV})"
    if not isinstance(store, LocalStore):
        return f"{unsigned} and the store is not a local folder ({store.location})"
    folder = store.artefacts().directory
    for path in (store.directory, folder):
        if (why := _owned_and_private(path)) is not None:
            return f"{unsigned} and {why}"
    try:
        entered = bool(os.lstat(folder).st_mode & (stat.S_IXGRP | stat.S_IXOTH))
    except FileNotFoundError:
        entered = False
    if (why := _owned_and_private(folder / f"{key}.bin", entered)) is not None:
        return f"{unsigned} and {why}"
    return None
