"""A remembered decision and its stored form: JSON with a digest, optionally signed.

An entry is `{"format", "key", "parts", "decision", "digest", "signature"}`. The digest
(SHA-256 of the rest) catches a corrupt or truncated entry; the signature (HMAC-SHA256
under the key in CHAIN_MEMORY_KEY) catches a forged one. With a signing key set, an entry
without a valid signature is refused: a shared store is trusted only as far as its key.
Then every field is checked against the schema (`Decision.from_dict`: types, finite
non-negative times, `parts` an object, nesting at most MAX_DEPTH): an entry that fails any
check is BadEntry, which the chain turns into a warning, a note and a cold start. A blank
CHAIN_MEMORY_KEY is refused, never read as "unsigned".
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from chain.report import json_fields as jf
from chain.report.records import Attempt, Status

FORMAT = 1
SIGNING_KEY_ENV = "CHAIN_MEMORY_KEY"
MAX_DEPTH = 64  # the chain's own entries nest about 8 deep (decision, attempts, details)


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
    def from_dict(cls, data: Any) -> Decision:
        """The decision `to_dict` wrote, every field's type checked (the store is shared):
        a TypeError or ValueError naming the first field that is not what it should be."""
        data = jf.mapping(data, "decision")
        attempts = tuple(
            Attempt.from_dict(a) for a in jf.array(data["attempts"], "decision: attempts")
        )
        winner = jf.text(data["winner"], "decision: winner")
        won = [a.backend for a in attempts if a.status is Status.WON]
        if won != [winner]:
            raise BadEntry(f"winner {jf.short(winner)} is not the one won attempt ({won})")
        return cls(
            winner=winner,
            attempts=attempts,
            eager_ms=_figure(data.get("eager_ms"), "decision: eager_ms"),
            eager_spread_ms=_figure(data.get("eager_spread_ms"), "decision: eager_spread_ms"),
            decided_at=jf.text(data.get("decided_at", ""), "decision: decided_at"),
            host=jf.text(data.get("host", ""), "decision: host"),
            pid=_count(data.get("pid", 0), "decision: pid"),
            extra=_extra(data.get("extra") or {}),
        )


def _figure(value: Any, what: str) -> float | None:
    """A stored time: null or a finite number >= 0 (reports add and format them)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} should be a number or null, got {jf.short(value)}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} should be finite and >= 0, got {jf.short(value)}")
    return float(value)


def _count(value: Any, what: str) -> int:
    """A stored count or id: an int >= 0."""
    if jf.integer(value, what) < 0:
        raise ValueError(f"{what} should be >= 0, got {value}")
    return int(value)


def _extra(value: Any) -> dict[str, Any]:
    """The decision's `extra`, the fields the chain reads checked: origin and fingerprint
    text, eager_errors a list of numbers or nulls, buckets a list (chain.run.buckets checks
    each)."""
    extra = dict(jf.mapping(value, "decision: extra"))
    for name in ("origin", "fingerprint"):
        jf.optional_text(extra.get(name), f"decision: extra.{name}")
    if "eager_errors" in extra:  # non-finite ones are allowed: Recall.recorded skips them
        errors = jf.array(extra["eager_errors"], "decision: extra.eager_errors")
        for i, e in enumerate(errors):
            if e is not None and (isinstance(e, bool) or not isinstance(e, int | float)):
                raise TypeError(f"decision: extra.eager_errors[{i}] should be a number or null")
    if "buckets" in extra:
        jf.array(extra["buckets"], "decision: extra.buckets")
    return extra


def signing_key() -> bytes | None:
    """The HMAC key from CHAIN_MEMORY_KEY, or None when it is unset (entries are then only
    digested). Set but blank is BadEntry: an empty key must never silently mean unsigned."""
    value = os.environ.get(SIGNING_KEY_ENV)
    if value is None:
        return None
    if not value.strip():
        raise BadEntry(
            f"{SIGNING_KEY_ENV} is set but blank: set the fleet's signing key, or unset it "
            "for unsigned entries"
        )
    return value.encode()


def _canonical(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def same_digest(stored: Any, expected: str) -> bool:
    """Whether a stored digest or signature is `expected`, in constant time; any stored
    value that is not a string (or not ASCII) simply does not match."""
    return isinstance(stored, str) and hmac.compare_digest(
        stored.encode("utf-8", "replace"), expected.encode()
    )


def encode(key: str, parts: Mapping[str, Any], decision: Decision) -> bytes:
    """The entry for `decision` under `key`, as UTF-8 JSON bytes, digested and maybe signed."""
    body = {"format": FORMAT, "key": key, "parts": parts, "decision": decision.to_dict()}
    raw = _canonical(body)
    entry = dict(body, digest=hashlib.sha256(raw).hexdigest())
    secret = signing_key()
    entry["signature"] = hmac.new(secret, raw, "sha256").hexdigest() if secret else None
    return json.dumps(entry, sort_keys=True).encode()


def load_json(data: bytes, refusal: str = "not JSON") -> Any:
    """`data` parsed as JSON; BadEntry starting with `refusal` when it is not (bad UTF-8,
    syntax, a number too long to convert, nesting too deep for the parser)."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:
        raise BadEntry(f"{refusal} ({type(e).__name__}: {e})"[:300]) from None


def _checked_body(entry: Any) -> tuple[dict[str, Any], bytes]:
    """The entry's signed body and its canonical bytes, once its digest and (under
    CHAIN_MEMORY_KEY) its signature match; BadEntry saying which check failed."""
    if not isinstance(entry, dict) or not {"key", "parts", "decision", "digest"} <= set(entry):
        raise BadEntry("not a decision entry (fields missing)")
    if type(entry.get("format")) is not int or entry["format"] != FORMAT:
        raise BadEntry(f"format {jf.short(entry.get('format'))}, this version reads {FORMAT}")
    body = {k: entry[k] for k in ("format", "key", "parts", "decision")}
    raw = _canonical(body)
    if not same_digest(entry["digest"], hashlib.sha256(raw).hexdigest()):
        raise BadEntry("digest does not match its content (corrupt or edited)")
    secret = signing_key()
    if secret is not None:
        signature = entry.get("signature")
        if not isinstance(signature, str):
            raise BadEntry(f"not signed, and {SIGNING_KEY_ENV} is set: only signed entries load")
        if not same_digest(signature, hmac.new(secret, raw, "sha256").hexdigest()):
            raise BadEntry(f"signature does not match under {SIGNING_KEY_ENV} (tampered?)")
    return body, raw


def decode(data: bytes, key: str | None = None) -> tuple[Decision, dict[str, Any]]:
    """The decision and key parts in an entry; BadEntry saying which check failed.

    Checked in order: JSON, the fields, the digest, the signature, the key, then every
    field's type (the schema of `Decision.from_dict`; `parts` an object): an entry from a
    shared store is data from strangers until then.
    `key`: the key the entry was looked up under (an entry filed under another is refused).
    """
    entry = load_json(data)
    if jf.deeper_than(entry, MAX_DEPTH):  # reports nest it further: their writers recurse
        raise BadEntry(f"nested deeper than {MAX_DEPTH} levels")
    body, _ = _checked_body(entry)
    if not isinstance(body["key"], str) or (key is not None and body["key"] != key):
        raise BadEntry(f"filed under {key} but made for {jf.short(body['key'])}")
    if not isinstance(body["parts"], dict):
        raise BadEntry(f"parts should be an object, got {jf.short(body['parts'])}")
    try:
        decision = Decision.from_dict(body["decision"])
    except (KeyError, TypeError, ValueError) as e:
        raise BadEntry(f"decision unreadable ({type(e).__name__}: {e})") from None
    return decision, dict(body["parts"])
