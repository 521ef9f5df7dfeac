"""The decision store's tools (chain.memory): `entries()`, `show(key)`, `clear()`.

Each takes `store=`: a directory (a cache root holding a `decisions` folder means that
folder) or a redis:// URL (default: CHAIN_STORE, else the local cache directory). Entries
hold data from strangers: `entries()` returns stored text as it is, `printable()` makes it
safe for a terminal (the CLI prints through it); names in the store's space that are not
decision keys are rows whose `check` says so in `entries`, and are left alone by `cleared`.
The same from a shell: `python -m chain store list|show KEY|clear`.
"""

from __future__ import annotations

from chain.memory.stores import default_dir, open_store
from chain.memory.tools import clear, cleared, entries, printable, show

__all__ = ["clear", "cleared", "default_dir", "entries", "open_store", "printable", "show"]
