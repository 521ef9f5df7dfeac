"""Where decisions live: a local directory (the default) or Redis (a fleet shares one).

A store holds bytes under keys; it knows nothing of what an entry means (chain.memory.entry
checks that). A store that cannot be reached raises StoreUnavailable, which the chain turns
into a warning and a cold start.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol

from backends.common.files import UnsafeFile, atomic_write, private_dir, read_bounded
from backends.options import BadValue

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
    Artefacts: one `.bin` file per key in its `artefacts` folder, written the same way.

    Every file goes through the file layer (backends.common.files): a read is bounded
    (`max_bytes`) and a symlink, FIFO or device at an entry path is refused, never followed,
    written through or waited on (StoreUnavailable: a warning and a cold start); a folder
    the store creates is private to the user (0700)."""

    ENTRY_MAX_BYTES = 64 << 20  # an entry is kilobytes (attempts, notes, buckets)
    ARTEFACT_MAX_BYTES = 4 << 30  # above any artefact stored (an ONNX model is < 2 GiB)

    def __init__(
        self, directory: str | os.PathLike[str], suffix: str = ".json", max_bytes: int = 0
    ) -> None:
        self.directory = Path(directory).expanduser()
        self.location = str(self.directory)
        self.suffix = suffix
        self.max_bytes = max_bytes or self.ENTRY_MAX_BYTES  # the largest file read back

    def _path(self, key: str) -> Path:
        return self.directory / f"{check_key(key)}{self.suffix}"

    def artefacts(self) -> LocalStore:
        """The artefacts kept with the decisions: `<directory>/artefacts/<key>.bin`."""
        return LocalStore(
            self.directory / "artefacts", suffix=".bin", max_bytes=self.ARTEFACT_MAX_BYTES
        )

    def get(self, key: str) -> bytes | None:
        path = self._path(key)
        try:
            return read_bounded(path, self.max_bytes)
        except FileNotFoundError:
            return None
        except UnsafeFile as e:  # it names the path and what is there
            raise StoreUnavailable(f"refused {e}") from e
        except OSError as e:
            raise StoreUnavailable(f"cannot read {path}: {e}") from e

    def put(self, key: str, data: bytes) -> None:
        try:
            private_dir(self.directory)
            atomic_write(self._path(key), data)
        except UnsafeFile as e:
            raise StoreUnavailable(f"refused {e}") from e
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
    ENTRY_MAX_BYTES = 64 << 20  # as LocalStore: an entry is kilobytes
    ARTEFACT_MAX_BYTES = 512 << 20  # Redis's own cap on a string (proto-max-bulk-len)
    max_bytes = ENTRY_MAX_BYTES  # the largest value read back
    # the URL options the store takes: {name: (kind, low, high)}; bounds are inclusive
    URL_OPTIONS: ClassVar[Mapping[str, tuple[type, float, float]]] = {
        "db": (int, 0, 2**31 - 1),
        "socket_timeout": (float, 1e-3, 3600),
        "socket_connect_timeout": (float, 1e-3, 3600),
        "timeout": (float, 1e-3, 3600),
        "health_check_interval": (int, 0, 86400),
        "max_connections": (int, 1, 2**16),
        "protocol": (int, 2, 3),
        "socket_keepalive": (bool, 0, 1),
        "retry_on_timeout": (bool, 0, 1),
        "ssl_check_hostname": (bool, 0, 1),
        "client_name": (str, 0, 0),
        "ssl_cert_reqs": (str, 0, 0),
        "ssl_ca_certs": (str, 0, 0),
        "ssl_certfile": (str, 0, 0),
        "ssl_keyfile": (str, 0, 0),
    }

    def __init__(self, url: str, timeout_s: float = 2.0) -> None:
        try:
            import redis
        except ImportError:
            raise StoreUnavailable(
                f"store {url} needs the redis client: pip install 'backend-chain[fleet]'"
            ) from None
        try:
            RedisStore.check_url(url)
        except ValueError as e:  # chain() checked it already: the tools and direct use meet it
            raise StoreUnavailable(str(e)) from None
        self.location = RedisStore.redacted(url)
        self._client: Any = self._call(
            lambda: redis.Redis.from_url(
                url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
            )
        )

    @staticmethod
    def check_url(url: str) -> str:
        """`url` if the store can use it, else a one-line ValueError naming it (password
        hidden) and what is wrong (`url_problem`)."""
        problem = RedisStore.url_problem(url)
        if problem:
            raise ValueError(f"redis store URL {RedisStore.redacted(url)!r}: {problem}")
        return url

    @staticmethod
    def url_problem(url: str) -> str:
        """What makes `url` unusable for the store ("" if nothing): a URL that does not
        parse, a port outside 1-65535, a database that is not a number, an option it does
        not take (such as decode_responses: the store holds bytes), a value out of range.
        The checks are the store's own, so they hold without the redis client installed."""
        from urllib.parse import parse_qs, urlsplit

        try:
            parts = urlsplit(url)
            port = parts.port  # parsed on access: ValueError when not a number in 0-65535
            options = parse_qs(parts.query, keep_blank_values=True)
        except ValueError as e:
            return str(e)
        if parts.scheme not in ("redis", "rediss", "unix"):
            return "redis://, rediss:// or unix:// expected"
        if port == 0:
            return "port 0 (1 to 65535 expected)"
        db = parts.path.strip("/")
        if parts.scheme != "unix" and db and not (db.isdigit() and db.isascii()):
            return f"database {db[:20]!r}, a number expected"
        problems = (RedisStore._option_problem(k, v) for k, vs in options.items() for v in vs)
        return next((p for p in problems if p), "")

    @staticmethod
    def redacted(url: str) -> str:
        """`url` with its password, if any, as `***`: what messages, notes and reports show."""
        head, at, tail = url.rpartition("@")
        if not at or "://" not in head:
            return url
        scheme, _, user = head.partition("://")
        return f"{scheme}://{user.partition(':')[0]}:***@{tail}" if ":" in user else url

    @staticmethod
    def _option_problem(name: str, value: str) -> str:
        """What is wrong with one `?name=value` of a store URL, against URL_OPTIONS."""
        import math

        spec = RedisStore.URL_OPTIONS.get(name)
        if spec is None:
            why = " (the store holds bytes)" if name in ("decode_responses", "encoding") else ""
            return f"option {name[:40]!r} refused{why}; valid: {', '.join(RedisStore.URL_OPTIONS)}"
        kind, low, high = spec
        if kind is str:
            return ""
        if kind is bool:
            ok = value.strip().lower() in ("", "0", "1", "true", "false", "yes", "no")
        else:
            try:
                number = kind(value)
                ok = math.isfinite(number) and low <= number <= high
            except ValueError:
                ok = False
        if ok:
            return ""
        expected = "true or false" if kind is bool else f"a number from {kind(low)} to {kind(high)}"
        return f"{name}={value[:40]!r}, {expected} expected"

    def _call(self, fn: Callable[[], Any]) -> Any:
        """`fn()`, every failure of the client, whatever its class (a reply it cannot parse
        or decode, a bad setting found at connect time...), as StoreUnavailable."""
        try:
            return fn()
        except Exception as e:  # the client's failures have no common base: all mean "down"
            raise StoreUnavailable(f"redis at {self.location}: {type(e).__name__}: {e}") from e

    def get(self, key: str) -> bytes | None:
        name = self.PREFIX + check_key(key)
        size = self._call(lambda: self._client.strlen(name))  # bounded: asked before reading
        data = None if size == 0 else self._call(lambda: self._client.get(name))
        if data is not None and not isinstance(data, bytes):
            raise StoreUnavailable(
                f"redis at {self.location}: answered a {type(data).__name__} for {name}, not bytes"
            )
        for length in (size, len(data or b"")):
            if type(length) is not int or length > self.max_bytes:
                raise StoreUnavailable(
                    f"redis at {self.location}: {name} holds {length} bytes, over the "
                    f"{self.max_bytes} it reads back"
                )
        return data

    def put(self, key: str, data: bytes) -> None:
        name = self.PREFIX + check_key(key)
        self._call(lambda: self._client.set(name, data))

    def names(self) -> Iterator[str]:
        names = self._call(lambda: list(self._client.scan_iter(match=self.PREFIX + "*")))
        for name in sorted(names, key=str):
            # a key another program wrote may not be UTF-8: it is listed, never decoded blind
            text = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
            yield text.removeprefix(self.PREFIX)

    def delete(self, key: str) -> bool:
        name = self.PREFIX + check_key(key)
        return bool(self._call(lambda: self._client.delete(name)))

    def artefacts(self) -> RedisStore:
        """The artefacts, in the same database under `backend-chain:artefact:`."""
        other = RedisStore.__new__(RedisStore)
        other.__dict__.update(
            self.__dict__, PREFIX="backend-chain:artefact:", max_bytes=self.ARTEFACT_MAX_BYTES
        )
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


def check_store(value: Any) -> Any:
    """Where decisions are remembered: a directory, or a redis:// (rediss://, unix://) URL."""
    if not isinstance(value, str | os.PathLike):
        raise BadValue("a directory or a redis://host:port/db URL")
    text = os.fspath(value)
    if not text:
        raise BadValue("a directory or a redis://host:port/db URL, not empty")
    if "://" in text and not text.startswith(("redis://", "rediss://", "unix://")):
        raise BadValue(f"a directory or a redis://host:port/db URL; {text!r} is neither")
    # the store's own checks, so that a bad URL fails here, not at the first call
    redis_url = text.startswith(("redis://", "rediss://", "unix://"))
    if redis_url and (problem := RedisStore.url_problem(text)):
        raise BadValue(f"a usable redis URL; {RedisStore.redacted(text)!r}: {problem}")
    return value
