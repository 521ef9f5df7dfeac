"""`chain.memory` and `python -m chain store list|show KEY|clear [KEY]`: what the decision
store holds, one entry in full, and removing entries. `--store` (or CHAIN_STORE) picks it."""

from __future__ import annotations

import argparse
import json
import os
import sys
import unicodedata
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from chain.memory.entry import BadEntry, decode
from chain.memory.stores import Store, StoreUnavailable, check_key, open_store

Spec = str | os.PathLike[str] | None
FOREIGN = "not a decision key: skipped, neither read nor removed"


def printable(text: Any, limit: int = 200) -> str:
    """`text` safe for a terminal: control and format characters (escapes, carriage returns,
    bidi overrides) shown as `\\x1b`-style escapes, and cut to `limit` characters: a
    shared store's host and origin fields are data from strangers."""
    text = str(text)
    shown = "".join(_escaped(c) for c in text[:limit])
    return shown + ("..." if len(text) > limit else "")


def _escaped(char: str) -> str:
    """`char`, or its escape when it is a control, format or unassigned character."""
    if not unicodedata.category(char).startswith("C"):
        return char
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"


def _is_key(name: str) -> bool:
    """Whether `name` is a decision key as the chain writes them (stores.check_key)."""
    try:
        check_key(name)
    except ValueError:
        return False
    return True


def _split(names: Iterator[str]) -> tuple[list[str], list[str]]:
    """The store's names as (keys the chain writes, foreign names): a foreign one (another
    program's key under the store's prefix) is never read, shown raw or removed."""
    ours: list[str] = []
    foreign: list[str] = []
    for name in names:
        (ours if _is_key(name) else foreign).append(name)
    return ours, foreign


DECISIONS = "decisions"  # the folder of decisions inside a cache root (CHAIN_CACHE_DIR)


def resolved(store: Spec) -> Spec:
    """`store` as the stores take it: a cache root (what CHAIN_CACHE_DIR names) that holds
    no entries of its own but a `decisions` folder means that folder, so that
    `chain store --store $CHAIN_CACHE_DIR list` lists what the chain remembered there."""
    if store is None or os.fspath(store).startswith(("redis://", "rediss://", "unix://")):
        return store
    root = Path(os.fspath(store)).expanduser()
    inner = root / DECISIONS
    if not inner.is_dir() or inner.is_symlink():
        return store
    own = [p.stem for p in root.glob("*.json") if _is_key(p.stem)]
    return store if own else inner


def _open(store: Spec) -> Store:
    """The store `store` names, a cache root meaning its decisions folder (`resolved`)."""
    return open_store(resolved(store))


def entries(store: Spec = None) -> list[dict[str, Any]]:
    """One summary per entry: key, winner, when and where decided, the graph's origin, and
    `check` ("ok" or why the entry would be ignored); a name in the store's space that is
    not a decision key is a row whose check says it was skipped."""
    opened = _open(store)
    ours, foreign = _split(opened.names())
    out = []
    for key in ours:
        data = opened.get(key)
        row: dict[str, Any] = {"key": key}
        if data is None:  # removed since listed
            continue
        try:
            decision, _ = decode(data, key)
        except BadEntry as e:
            out.append({**row, "check": str(e)})
            continue
        out.append(
            {
                **row,
                "winner": decision.winner,
                "decided_at": decision.decided_at,
                "host": decision.host,
                "pid": decision.pid,
                "origin": decision.extra.get("origin"),
                "check": "ok",
            }
        )
    return out + [{"key": name, "check": FOREIGN} for name in foreign]


def show(key: str, store: Spec = None) -> dict[str, Any]:
    """The entry under `key` as stored (JSON), plus `check`; KeyError if there is none."""
    data = _open(store).get(key)
    if data is None:
        raise KeyError(f"no entry {key}")
    try:
        decode(data, key)
        check = "ok"
    except BadEntry as e:
        check = str(e)
    try:
        entry = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        entry = {"raw": data[:200].decode("utf-8", "replace")}
    return {**(entry if isinstance(entry, dict) else {"raw": entry}), "check": check}


def clear(store: Spec = None, key: str | None = None) -> int:
    """Remove the entry `key`, or every entry, with their artefacts; returns how many
    entries were removed (`cleared` also says which foreign names were left alone)."""
    return cleared(store, key)[0]


def cleared(store: Spec = None, key: str | None = None) -> tuple[int, list[str]]:
    """`clear`, and the names in the store's spaces that are not decision keys: skipped,
    not removed (another program's data, or a planted name), so that one of them never
    stops a clear halfway."""
    opened = _open(store)
    artefacts = opened.artefacts()
    if key is not None:
        check_key(key)
        keys, foreign, stale = [key], [], [key]
    else:
        keys, foreign = _split(opened.names())
        stale, more = _split(artefacts.names())
        foreign += more
    for k in stale:
        artefacts.delete(k)
    return sum(opened.delete(k) for k in keys), foreign


def main(argv: Sequence[str]) -> int:
    """`chain store ...`: a one-line error and exit status 2 when the store cannot be used."""
    parser = argparse.ArgumentParser(prog="chain store", description=__doc__)
    parser.add_argument(
        "--store",
        help="the folder that holds the entries, or a cache root (what CHAIN_CACHE_DIR "
        "names), which means its decisions folder; or a redis:// URL (default: "
        "CHAIN_STORE, else the local cache)",
    )
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="one line per remembered decision")
    show_p = sub.add_parser("show", help="one entry in full (JSON)")
    show_p.add_argument("key")
    clear_p = sub.add_parser("clear", help="remove one entry, or all")
    clear_p.add_argument("key", nargs="?")
    args = parser.parse_args(list(argv))
    try:
        if args.action == "list":
            _list(args.store)
        elif args.action == "show":
            print(json.dumps(show(args.key, args.store), indent=2))  # JSON escapes controls
        else:
            removed, foreign = cleared(args.store, args.key)
            print(f"removed {removed} entr(ies) from {printable(_where(args.store))}")
            _skipped(foreign)
    except (StoreUnavailable, KeyError, ValueError) as e:
        message = e.args[0] if isinstance(e, KeyError) else e
        print(f"chain store: error: {printable(message, 500)}", file=sys.stderr)
        return 2
    return 0


def _list(store: Spec) -> None:
    """`chain store list`: one line per entry, every stored string made printable."""
    rows = entries(store)
    ours = [r for r in rows if r["check"] != FOREIGN]
    for r in ours:  # labelled by where the graph came from: the model class and its line
        fields = (r["origin"], f"won by {r['winner']}", r["decided_at"], r["host"])
        what = "  ".join(printable(f, 120) for f in fields)
        shown = what if r["check"] == "ok" else "IGNORED: " + printable(r["check"], 300)
        print(f"{r['key']}  {shown}")
    print(f"{len(ours)} entr{'y' if len(ours) == 1 else 'ies'} in {printable(_where(store))}")
    _skipped([r["key"] for r in rows if r["check"] == FOREIGN])


def _skipped(foreign: list[str]) -> None:
    """A note on stderr for the foreign names a command left alone."""
    if foreign:
        names = ", ".join(printable(n, 80) for n in foreign[:5])
        more = f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        print(
            f"chain store: skipped {len(foreign)} foreign name(s): {names}{more} ({FOREIGN})",
            file=sys.stderr,
        )


def _where(store: Spec) -> str:
    return _open(store).location
