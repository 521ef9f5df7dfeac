"""The decision store's tools (chain.memory): `entries()`, `show(key)`, `clear()`.

Each takes `store=`: a directory or a redis:// URL (default: CHAIN_STORE, else the local
cache directory). The same from a shell: `python -m chain store list|show KEY|clear`.
"""

from __future__ import annotations

from chain.memory.stores import default_dir, open_store
from chain.memory.tools import clear, entries, show

__all__ = ["clear", "default_dir", "entries", "open_store", "show"]
