"""A remembered decision and its stored form: JSON with a digest, optionally signed.

An entry is `{"format", "key", "parts", "decision", "digest", "signature"}`. The digest
(SHA-256 of the rest) catches a corrupt or truncated entry; the signature (HMAC-SHA256
under the key in CHAIN_MEMORY_KEY) catches a forged one. With a signing key set, an entry
without a valid signature is refused: a shared store is trusted only as far as its key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from chain.records import Attempt, Status

FORMAT = 1
SIGNING_KEY_ENV = "CHAIN_MEMORY_KEY"


class BadEntry(ValueError):
    """A stored entry that fails its checks (corrupt, tampered, unsigned, another key's)."""


@dataclass(frozen=True)
class Decision:
    """Who won a graph, the attempts' statuses and figures, and when and where it was decided."""

    winner: str
    attempts: tuple[Attempt, ...]
    eager_ms: float | None = None
    eager_spread_ms: float | None = None
    decided_at: str = ""  # ISO 8601, UTC
    host: str = ""
    pid: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def winning_attempt(self) -> Attempt | None:
        return next((a for a in self.attempts if a.backend == self.winner), None)

    def where(self) -> str:
        """`2025-01-01T00:00:00Z on host (pid 12)`: for notes and the CLI."""
        return f"{self.decided_at} on {self.host} (pid {self.pid})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "winner": self.winner,
            "attempts": [a.to_dict() for a in self.attempts],
            "eager_ms": self.eager_ms,
            "eager_spread_ms": self.eager_spread_ms,
            "decided_at": self.decided_at,
            "host": self.host,
            "pid": self.pid,
            "extra": dict(self.extra),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Decision:
        attempts = tuple(Attempt.from_dict(a) for a in data["attempts"])
        won = [a.backend for a in attempts if a.status is Status.WON]
        if won != [data["winner"]]:
            raise BadEntry(f"winner {data['winner']!r} is not the one won attempt ({won})")
        return cls(
            winner=str(data["winner"]),
            attempts=attempts,
            eager_ms=data.get("eager_ms"),
            eager_spread_ms=data.get("eager_spread_ms"),
            decided_at=str(data.get("decided_at", "")),
            host=str(data.get("host", "")),
            pid=int(data.get("pid", 0)),
            extra=dict(data.get("extra") or {}),
        )


def signing_key() -> bytes | None:
    """The HMAC key from CHAIN_MEMORY_KEY, or None (entries are then only digested)."""
    value = os.environ.get(SIGNING_KEY_ENV)
    return value.encode() if value else None


def _canonical(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def encode(key: str, parts: Mapping[str, Any], decision: Decision) -> bytes:
    """The entry for `decision` under `key`, as UTF-8 JSON bytes, digested and maybe signed."""
    body = {"format": FORMAT, "key": key, "parts": parts, "decision": decision.to_dict()}
    raw = _canonical(body)
    entry = dict(body, digest=hashlib.sha256(raw).hexdigest())
    secret = signing_key()
    entry["signature"] = hmac.new(secret, raw, "sha256").hexdigest() if secret else None
    return json.dumps(entry, sort_keys=True).encode()


def decode(data: bytes, key: str | None = None) -> tuple[Decision, dict[str, Any]]:
    """The decision and key parts in an entry; BadEntry saying which check failed.

    `key`: the key the entry was looked up under (an entry filed under another is refused).
    """
    try:
        entry = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadEntry(f"not JSON ({e})") from None
    if not isinstance(entry, dict) or not {"key", "parts", "decision", "digest"} <= set(entry):
        raise BadEntry("not a decision entry (fields missing)")
    if entry.get("format") != FORMAT:
        raise BadEntry(f"format {entry.get('format')!r}, this version reads {FORMAT}")
    body = {k: entry[k] for k in ("format", "key", "parts", "decision")}
    raw = _canonical(body)
    if not hmac.compare_digest(str(entry["digest"]), hashlib.sha256(raw).hexdigest()):
        raise BadEntry("digest does not match its content (corrupt or edited)")
    secret = signing_key()
    if secret is not None:
        signature = entry.get("signature")
        if not isinstance(signature, str):
            raise BadEntry(f"not signed, and {SIGNING_KEY_ENV} is set: only signed entries load")
        if not hmac.compare_digest(signature, hmac.new(secret, raw, "sha256").hexdigest()):
            raise BadEntry(f"signature does not match under {SIGNING_KEY_ENV} (tampered?)")
    if key is not None and entry["key"] != key:
        raise BadEntry(f"filed under {key} but made for {entry['key']}")
    try:
        decision = Decision.from_dict(entry["decision"])
    except (KeyError, TypeError, ValueError) as e:
        raise BadEntry(f"decision unreadable ({type(e).__name__}: {e})") from None
    return decision, dict(entry["parts"])
