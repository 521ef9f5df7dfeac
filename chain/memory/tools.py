"""`chain.store` and `python -m chain store list|show KEY|clear [KEY]`: what the decision
store holds, one entry in full, and removing entries. `--store` (or CHAIN_STORE) picks it."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from chain.memory.entry import BadEntry, decode
from chain.memory.stores import StoreUnavailable, open_store

Spec = str | os.PathLike[str] | None


def entries(store: Spec = None) -> list[dict[str, Any]]:
    """One summary per entry: key, winner, when and where decided, the graph's origin, and
    `check` ("ok" or why the entry would be ignored)."""
    opened = open_store(store)
    out = []
    for key in opened.names():
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
    return out


def show(key: str, store: Spec = None) -> dict[str, Any]:
    """The entry under `key` as stored (JSON), plus `check`; KeyError if there is none."""
    data = open_store(store).get(key)
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
    entries were removed."""
    opened = open_store(store)
    artefacts = opened.artefacts()
    keys = [key] if key is not None else list(opened.names())
    for k in keys if key is not None else list(artefacts.names()):
        artefacts.delete(k)
    return sum(opened.delete(k) for k in keys)


def main(argv: Sequence[str]) -> int:
    """`chain store ...`: a one-line error and exit status 2 when the store cannot be used."""
    parser = argparse.ArgumentParser(prog="chain store", description=__doc__)
    parser.add_argument("--store", help="directory or redis:// URL (default: CHAIN_STORE)")
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="one line per remembered decision")
    show_p = sub.add_parser("show", help="one entry in full (JSON)")
    show_p.add_argument("key")
    clear_p = sub.add_parser("clear", help="remove one entry, or all")
    clear_p.add_argument("key", nargs="?")
    args = parser.parse_args(list(argv))
    try:
        if args.action == "list":
            rows = entries(args.store)
            for r in rows:
                what = f"{r['winner']}  {r['decided_at']}  {r['host']}  {r['origin']}"
                print(f"{r['key']}  {what if r['check'] == 'ok' else 'IGNORED: ' + r['check']}")
            print(f"{len(rows)} entr{'y' if len(rows) == 1 else 'ies'} in {_where(args.store)}")
        elif args.action == "show":
            print(json.dumps(show(args.key, args.store), indent=2))
        else:
            print(f"removed {clear(args.store, args.key)} entr(ies) from {_where(args.store)}")
    except (StoreUnavailable, KeyError, ValueError) as e:
        message = e.args[0] if isinstance(e, KeyError) else e
        print(f"chain store: error: {message}", file=sys.stderr)
        return 2
    return 0


def _where(store: Spec) -> str:
    return open_store(store).location
