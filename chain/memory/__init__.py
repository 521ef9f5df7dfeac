"""Remembered decisions: per graph, the winner a selection chose, kept in a store so that
a new process compiles only that winner (verified once against eager, not timed).

key.py: what the key hashes; entry.py: the stored form (digest, HMAC); stores.py: a local
directory or Redis; remember.py: lookup and store around the chain's selection; tools.py:
list, show, clear: `entries()`, `show(key)`, `clear()` here, `python -m chain store ...` from
a shell (each takes `store=`: a directory, a cache root holding a `decisions` folder, or a
redis:// URL; default CHAIN_STORE, else the local cache directory).
"""

from __future__ import annotations

from chain.memory.entry import BadEntry, Decision
from chain.memory.remember import Memory, MemoryWarning, Recall
from chain.memory.replay import hit_note, miss_note, replay
from chain.memory.stores import (
    CACHE_DIR_ENV,
    MEMORY_ENV,
    STORE_ENV,
    LocalStore,
    RedisStore,
    StoreUnavailable,
    default_dir,
    enabled_by_env,
    open_store,
)
from chain.memory.tools import clear, cleared, entries, printable, show

__all__ = [
    "CACHE_DIR_ENV",
    "MEMORY_ENV",
    "STORE_ENV",
    "BadEntry",
    "Decision",
    "LocalStore",
    "Memory",
    "MemoryWarning",
    "Recall",
    "RedisStore",
    "StoreUnavailable",
    "clear",
    "cleared",
    "default_dir",
    "enabled_by_env",
    "entries",
    "hit_note",
    "miss_note",
    "open_store",
    "printable",
    "replay",
    "show",
]
