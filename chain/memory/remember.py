"""The chain's memory: look a graph's decision up before selection, store it after.

Records in, records out: the chain hands over its graph, inputs and finished record; this
module never calls a backend. A store that fails is a warning and a cold start; an entry
that fails its checks is a note on the graph and a warning, and is never loaded.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import socket
import threading
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from torch import fx

import chain.memory.artefacts as artefacts
from backends.errors import InvalidOption
from backends.options import BadValue
from backends.registry import Artefact, offered_artefact
from chain.memory.entry import BadEntry, Decision, decode, encode, signing_key
from chain.memory.key import digest, key_parts
from chain.memory.stores import (
    STORE_ENV,
    RedisStore,
    Store,
    StoreUnavailable,
    check_store,
    open_store,
)
from chain.memory.trust import read_native, why_untrusted
from chain.report.json_fields import short
from chain.report.records import Attempt, GraphRecord

PROVISIONAL = "provisional"  # in a decision's extra: why it is not settled (chain.judge.race)
NO_ARTEFACT = "no_artefact"  # in a decision's extra: backend -> why its artefact is not made


class MemoryWarning(UserWarning):
    """The decision store could not be used (unreachable, refused entry): selection runs."""


@dataclasses.dataclass(frozen=True)
class Recall:
    """A graph's lookup: its key (None: no key, nothing to store), the decision found, notes."""

    key: str | None
    parts: dict[str, Any]
    decision: Decision | None
    notes: tuple[str, ...] = ()

    def no_artefact(self, backend: str) -> str | None:
        """Why the decision says `backend`'s artefact is not made (None: nothing said)."""
        said = self.decision.extra.get(NO_ARTEFACT) if self.decision is not None else None
        why = said.get(backend) if isinstance(said, dict) else None
        return why if isinstance(why, str) else None

    @property
    def recorded(self) -> tuple[float | None, ...] | None:
        """Eager's relative error per output as the decision recorded it (None: no decision,
        or one stored without them, or with values that are not non-negative numbers)."""
        if self.decision is None:
            return None
        errors = self.decision.extra.get("eager_errors")
        if not isinstance(errors, list):
            return None
        ok = all(
            e is None or (isinstance(e, float | int) and math.isfinite(e) and e >= 0)
            for e in errors
        )
        return tuple(None if e is None else float(e) for e in errors) if ok else None


def _warn(message: str) -> None:
    warnings.warn(message, MemoryWarning, stacklevel=3)


def check_environment(spec: str | os.PathLike[str] | None) -> None:
    """The memory's environment, checked when the chain is built: a one-line InvalidOption
    for a blank CHAIN_MEMORY_KEY (it must not silently mean unsigned) or a CHAIN_STORE
    (when `spec` is None) that is not a directory or a usable redis URL."""
    try:
        signing_key()
    except BadEntry as e:
        raise InvalidOption(str(e)) from None
    text = os.environ.get(STORE_ENV) if spec is None else None
    if text:
        try:
            check_store(text)
        except BadValue as e:
            shown = short(RedisStore.redacted(text))
            raise InvalidOption(f"{STORE_ENV}={shown}: expected {e.expected}") from None


class Memory:
    """Decisions for one chain, in the store `spec` names (opened at the first lookup)."""

    def __init__(
        self,
        spec: str | os.PathLike[str] | None,
        chain: Mapping[str, Any],
        max_artefact_mb: float | None = None,
    ) -> None:
        self.spec = spec
        self.chain = dict(chain)
        self.max_artefact_bytes = artefacts.max_bytes(max_artefact_mb)
        check_environment(spec)
        self._store: Store | None = None
        self._down: str | None = None  # why the store is not used in this process
        self._lock = threading.Lock()
        self._writing = threading.Lock()

    def store(self) -> Store | None:
        """The store, opened once; None (with a warning, once) when it cannot be."""
        with self._lock:
            if self._store is None and self._down is None:
                try:
                    self._store = open_store(self.spec)
                except StoreUnavailable as e:
                    self._fail(str(e))
            return self._store

    def _fail(self, why: str) -> str:
        """Stop using the store for this process; warn once. Returns the graph's note."""
        if self._down is None:
            self._down = why
            self._store = None
            _warn(f"decision store unusable, selecting as usual (cold start): {why}")
        return f"memory: store unusable ({self._down}): cold start"

    def recall(self, gm: fx.GraphModule, inputs: Sequence[Any]) -> Recall:
        """The decision remembered for this graph on these inputs under this chain, if any."""
        parts = key_parts(gm, inputs, self.chain)
        key = digest(parts)
        store = self.store()
        if store is None:
            return Recall(key, parts, None, (self._fail(self._down or "closed"),))
        try:
            data = store.get(key)
        except StoreUnavailable as e:
            return Recall(key, parts, None, (self._fail(str(e)),))
        if data is None:
            return Recall(key, parts, None)
        try:
            decision, _ = decode(data, key)
        except BadEntry as e:
            note = f"memory: entry {key} in {store.location} ignored: {e}; selecting anew"
            _warn(note)
            return Recall(key, parts, None, (note,))
        return Recall(key, parts, decision)

    def remember(
        self,
        recall: Recall,
        record: GraphRecord,
        eager_errors: list[float | None] | None = None,
        provisional: str | None = None,
    ) -> str | None:
        """Store the record's decision under the recall's key; a note when it could not be.
        `eager_errors`: per output, eager's relative error against float64 in this selection:
        what a warm start's quick check of the winner is bounded by (`Recall.recorded`)."""
        if recall.key is None or record.winner is None:
            return None
        store = self.store()
        if store is None:
            return None  # the lookup's note already says why
        decision = decision_of(
            record,
            tuple(_without_memory(a) for a in record.attempts),
            **({"eager_errors": eager_errors} if eager_errors is not None else {}),
            # decided on noisy evidence: a warm process serves it and keeps racing it
            **({PROVISIONAL: provisional} if provisional else {}),
        )
        try:
            store.put(recall.key, encode(recall.key, recall.parts, decision))
        except StoreUnavailable as e:
            return self._fail(str(e))
        except BadEntry as e:  # no signing key to sign it with (CHAIN_MEMORY_KEY blank)
            return f"memory: not remembered: {e}"
        return None

    def forget(self, recall: Recall, why: str) -> str:
        """Delete the recall's decision (its winner was demoted at run time): the next
        process selects again. The graph's note says what happened."""
        store = self.store()
        if recall.key is None or store is None:
            return f"memory: nothing to forget ({why})"
        try:
            store.delete(recall.key)
        except StoreUnavailable as e:
            return self._fail(str(e))
        return f"memory: decision {recall.key} forgotten: {why}; the next process selects again"

    def remember_buckets(self, recall: Recall, buckets: list[dict[str, Any]]) -> str | None:
        """Keep a graph's bucket decisions (chain.run.buckets.remembered) with its decision, in
        `extra["buckets"]`; a note when they could not be (no entry, store down, refused)."""
        return self._amend(recall, "buckets", {"buckets": buckets})

    def remember_no_artefact(self, recall: Recall, backend: str, why: str) -> str | None:
        """Keep, with the decision, why `backend`'s artefact was not made (it failed, or ran
        slower): later processes do not build it again (`no_artefact`)."""
        return self._amend(recall, "artefact outcome", {NO_ARTEFACT: {backend: why[:500]}})

    def _amend(self, recall: Recall, what: str, fields: dict[str, Any]) -> str | None:
        """Add `fields` to the stored decision's `extra`; a note when it could not be."""
        store = self.store()
        if recall.key is None or store is None:
            return None
        with self._writing:  # one read-modify-write of an entry at a time in this process
            try:
                data = store.get(recall.key)
                if data is None:
                    return f"memory: {what} not kept: no entry {recall.key} in {store.location}"
                decision, parts = decode(data, recall.key)
                extra = {**decision.extra, **fields}
                kept = dataclasses.replace(decision, extra=extra)
                store.put(recall.key, encode(recall.key, parts, kept))
            except StoreUnavailable as e:
                return self._fail(str(e))
            except BadEntry as e:
                return f"memory: {what} not kept: entry {recall.key} refused ({e})"
        return None

    def artefact(
        self,
        recall: Recall,
        backend: str,
        gm: fx.GraphModule,
        inputs: Sequence[Any],
        native: bool = False,
    ) -> tuple[bytes | None, str | None]:
        """The stored artefact of the recalled winner `backend`, checked, and a note when
        one was found but is not used (failed a check, made for other weights). `native`:
        it holds code loading runs, so it must come from a trusted store (chain.memory.trust)."""
        store = self.store()
        if recall.key is None or store is None:
            return None, None
        try:
            if native:  # trust decided on the descriptors read, never by path after
                data, untrusted = read_native(store, recall.key)
            else:
                data, untrusted = store.artefacts().get(recall.key), None
        except StoreUnavailable as e:
            return None, self._fail(str(e))
        if untrusted is not None:
            note = (
                f"memory: artefact {recall.key} refused: it holds native code, and it is "
                f"{untrusted}; {backend} compiled as usual"
            )
            _warn(note)
            return None, note
        if data is None:
            return None, None
        try:
            artefact, weights = artefacts.decode(data, recall.key, backend)
        except BadEntry as e:
            note = (
                f"memory: artefact {recall.key} in {store.location} ignored: {e}; "
                f"{backend} compiled as usual"
            )
            _warn(note)
            return None, note
        digest, why = artefacts.weights_digest(gm, inputs, artefact.reads)
        if digest != weights:
            what = why or "made for other weights"
            note = f"memory: artefact {recall.key} not used ({what}); {backend} compiled as usual"
            return None, note
        return artefact.data, None

    def native_refusal(self, recall: Recall) -> str | None:
        """Why this store would not be trusted with an artefact holding native code (None:
        it would be, chain.memory.trust)."""
        store = self.store()
        if recall.key is None or store is None:
            return "no store"
        return why_untrusted(store, recall.key)

    def keep_artefact(
        self,
        recall: Recall,
        backend: str,
        fn: Any,
        gm: fx.GraphModule,
        inputs: Sequence[Any],
    ) -> str | None:
        """Store the artefact the winner's compiled `fn` offers under the recall's key; a
        note when it is not stored (too large, weights that cannot be hashed, store down)."""
        artefact = offered_artefact(fn)
        if artefact is None:
            return None
        return self.store_artefact(recall, backend, artefact, gm, inputs)

    def store_artefact(
        self,
        recall: Recall,
        backend: str,
        artefact: Artefact,
        gm: fx.GraphModule,
        inputs: Sequence[Any],
    ) -> str | None:
        """Store `artefact` of `backend` under the recall's key; a note when it is not."""
        store = self.store()
        if recall.key is None or store is None:
            return None
        if len(artefact.data) > self.max_artefact_bytes:
            return (
                f"memory: {backend}'s artefact not stored: {len(artefact.data) / 2**20:.1f} MiB "
                f"> max_artefact_mb {self.max_artefact_bytes / 2**20:g}"
            )
        weights, why = artefacts.weights_digest(gm, inputs, artefact.reads)
        if weights is None:
            return f"memory: {backend}'s artefact not stored: {why}"
        try:
            data = artefacts.encode(recall.key, backend, artefact, weights)
            store.artefacts().put(recall.key, data)
        except StoreUnavailable as e:
            return self._fail(str(e))
        except BadEntry as e:  # no signing key to sign it with (CHAIN_MEMORY_KEY blank)
            return f"memory: {backend}'s artefact not stored: {e}"
        return None


def _without_memory(attempt: Attempt) -> Attempt:
    """An attempt as stored: no `remembered` detail from an earlier replay."""
    details = {k: v for k, v in attempt.details.items() if k not in ("remembered", "artefact")}
    return dataclasses.replace(attempt, details=details)


def decision_of(record: GraphRecord, attempts: tuple[Attempt, ...], **extra: Any) -> Decision:
    """The record's decision as a store entry holds it: made here, now, with `extra`."""
    return Decision(
        winner=record.winner or "",
        attempts=attempts,
        eager_ms=record.eager_ms,
        eager_spread_ms=record.eager_spread_ms,
        decided_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        host=socket.gethostname(),
        pid=os.getpid(),
        extra={"origin": record.origin, "fingerprint": record.fingerprint, **extra},
    )
