"""Which reports this machine wrote: a keyed tag the chain adds when it saves a report.

`chain repro` runs the code a report records, so it runs it only for reports this user's
chain wrote on this machine (or with `--trust`). File ownership says nothing (a downloaded
report is the user's file): the chain adds `made_here`, an HMAC-SHA256 of the report's
content under a per-user machine key (`machine.key`, 32 random bytes, 0600, in the cache
folder: $CHAIN_CACHE_DIR, else $XDG_CACHE_HOME/backend-chain, else ~/.cache/backend-chain),
and the repro checks it. A report edited after it was written loses its tag.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
from pathlib import Path
from typing import Any

from backends.common.files import private_dir, read_bounded

FIELD = "made_here"
KEY_FILE = "machine.key"
_KEY_BYTES = 32


def _folder() -> Path:
    root = os.environ.get("CHAIN_CACHE_DIR")
    if root:
        return Path(root).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "backend-chain"


def machine_key(create: bool) -> bytes | None:
    """This user's machine key; made (0600, exclusively, no-follow) when `create` and
    missing; None when there is none or it is not a private regular file of the right size."""
    path = _folder() / KEY_FILE
    try:
        data = read_bounded(path, 1024)
        if os.stat(path, follow_symlinks=False).st_mode & 0o077:
            return None  # others may read it: it proves nothing
        return data if len(data) == _KEY_BYTES else None
    except FileNotFoundError:
        if not create:
            return None
    except OSError:
        return None
    try:
        private_dir(path.parent)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(path, flags, 0o600)
    except FileExistsError:  # another process made it meanwhile
        return machine_key(create=False)
    except OSError:
        return None
    key = secrets.token_bytes(_KEY_BYTES)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    return key


def _canonical(data: dict[str, Any]) -> bytes:
    body = {k: v for k, v in data.items() if k != FIELD}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=True).encode()


def tagged(data: dict[str, Any]) -> dict[str, Any]:
    """`data` (a report's JSON values) with its `made_here` tag; unchanged when no key can
    be kept (a read-only home: its repros then need --trust)."""
    key = machine_key(create=True)
    if key is None:
        return data
    return {**data, FIELD: hmac.new(key, _canonical(data), "sha256").hexdigest()}


def why_not_made_here(data: Any) -> str | None:
    """None when the parsed report `data` carries this machine's tag over its content;
    else why not, in words."""
    tag = data.get(FIELD) if isinstance(data, dict) else None
    if not isinstance(tag, str):
        return "not written by the chain on this machine (no tag)"
    key = machine_key(create=False)
    if key is None:
        return f"not checkable: no machine key in {_folder()}"
    if not hmac.compare_digest(tag, hmac.new(key, _canonical(data), "sha256").hexdigest()):
        return "not written by the chain on this machine, or edited since (its tag differs)"
    return None
