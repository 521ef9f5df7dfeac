"""Where decisions live: a local directory (the default) or Redis (a fleet shares one).

A store holds bytes under keys; it knows nothing of what an entry means (chain.memory.entry
checks that). A store that cannot be reached raises StoreUnavailable, which the chain turns
into a warning and a cold start.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from backends.common.files import atomic_write

STORE_ENV = "CHAIN_STORE"  # a directory or redis:// URL
CACHE_DIR_ENV = "CHAIN_CACHE_DIR"  # the cache root; decisions go in <root>/decisions
MEMORY_ENV = "CHAIN_MEMORY"  # "0" / "false" / "off": no lookups, no writes
_KEY = re.compile(r"^[0-9a-f]{8,64}$")


class StoreUnavailable(OSError):
    """The store cannot be reached or written (Redis down, a read-only folder)."""


class Store(Protocol):
    """Bytes under keys. `get` is None for a missing key; failures are StoreUnavailable."""

    location: str

    def get(self, key: str) -> bytes | None: ...
    def put(self, key: str, data: bytes) -> None: ...
    def names(self) -> Iterator[str]: ...
    def delete(self, key: str) -> bool: ...
    def artefacts(self) -> Store: ...


def default_dir() -> Path:
    """`$CHAIN_CACHE_DIR/decisions`, else `$XDG_CACHE_HOME/backend-chain/decisions`, else
    `~/.cache/backend-chain/decisions`: beside the TensorRT engine cache."""
    root = os.environ.get(CACHE_DIR_ENV)
    if root:
        return Path(root).expanduser() / "decisions"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "backend-chain" / "decisions"


def check_key(key: str) -> str:
    """A key as the chain makes them (hex): a path or Redis pattern cannot sneak in."""
    if not _KEY.match(key):
        raise ValueError(f"not a decision key: {key!r} (hex digits, as `chain store list` shows)")
    return key


class LocalStore:
    """One JSON file per key in a directory; written atomically (temp file + os.replace),
    so any number of processes may write one key: readers see a whole entry, the last one.
    Artefacts: one `.bin` file per key in its `artefacts` folder, written the same way."""

    def __init__(self, directory: str | os.PathLike[str], suffix: str = ".json") -> None:
        self.directory = Path(directory).expanduser()
        self.location = str(self.directory)
        self.suffix = suffix

    def _path(self, key: str) -> Path:
        return self.directory / f"{check_key(key)}{self.suffix}"

    def artefacts(self) -> LocalStore:
        """The artefacts kept with the decisions: `<directory>/artefacts/<key>.bin`."""
        return LocalStore(self.directory / "artefacts", suffix=".bin")

    def get(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StoreUnavailable(f"cannot read {self._path(key)}: {e}") from e

    def put(self, key: str, data: bytes) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            atomic_write(self._path(key), data)
        except OSError as e:
            raise StoreUnavailable(f"cannot write in {self.directory}: {e}") from e

    def names(self) -> Iterator[str]:
        if not self.directory.is_dir():
            return
        for path in sorted(self.directory.glob(f"*{self.suffix}")):
            if _KEY.match(path.stem):
                yield path.stem

    def delete(self, key: str) -> bool:
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            return False
        return True


class RedisStore:
    """Entries under `backend-chain:decision:<key>` in a Redis database, through `redis`;
    artefacts under `backend-chain:artefact:<key>`."""

    PREFIX = "backend-chain:decision:"

    def __init__(self, url: str, timeout_s: float = 2.0) -> None:
        try:
            import redis
        except ImportError:
            raise StoreUnavailable(
                f"store {url} needs the redis client: pip install 'backend-chain[fleet]'"
            ) from None
        self.location = url
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self._client: Any = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )

    def _call(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except self._errors as e:
            raise StoreUnavailable(f"redis at {self.location}: {type(e).__name__}: {e}") from e

    def get(self, key: str) -> bytes | None:
        return self._call(lambda: self._client.get(self.PREFIX + check_key(key)))

    def put(self, key: str, data: bytes) -> None:
        self._call(lambda: self._client.set(self.PREFIX + check_key(key), data))

    def names(self) -> Iterator[str]:
        names = self._call(lambda: list(self._client.scan_iter(match=self.PREFIX + "*")))
        for name in sorted(names):
            text = name.decode() if isinstance(name, bytes) else str(name)
            yield text.removeprefix(self.PREFIX)

    def delete(self, key: str) -> bool:
        return bool(self._call(lambda: self._client.delete(self.PREFIX + check_key(key))))

    def artefacts(self) -> RedisStore:
        """The artefacts, in the same database under `backend-chain:artefact:`."""
        other = RedisStore.__new__(RedisStore)
        other.__dict__.update(self.__dict__, PREFIX="backend-chain:artefact:")
        return other


def open_store(spec: str | os.PathLike[str] | None = None) -> Store:
    """The store `spec` names: a redis:// or rediss:// URL, or a directory; None: the
    CHAIN_STORE env variable, else the default directory."""
    if spec is None:
        spec = os.environ.get(STORE_ENV) or default_dir()
    text = os.fspath(spec)
    if text.startswith(("redis://", "rediss://", "unix://")):
        return RedisStore(text)
    return LocalStore(text)


def enabled_by_env() -> bool:
    """False when CHAIN_MEMORY says off ("0", "false", "no", "off")."""
    return os.environ.get(MEMORY_ENV, "1").strip().lower() not in ("0", "false", "no", "off")
