"""torch's precompile with a chain: a chain's compiled graph as bytes `aot_compile`'s
`save_compiled_function` keeps, loaded by `torch.compiler.load_compiled_function` in a
fresh process that compiles nothing.

The bytes are the chain's own formats: a first line `backend-chain-precompiled <format>
<entry length> <artefact length>`, the graph's decision as a store entry (`chain.memory.entry`:
key, key parts, decision, digest, HMAC under CHAIN_MEMORY_KEY) and the winner's artefact
(`chain.memory.artefacts`: key, backend, bytes' and weights' digests, HMAC). Loading checks
both as the store does, then that the entry's key is its parts' digest, the two name the
same key and winner, and the environment (packages, CPU, threads) is this one; the winner's
`revive` hook then runs the artefact without the graph. Its first call checks the weights
passed against the artefact's digest. Nothing is pickled or run but the backend's artefact.

Refused with a one-line `PrecompileError`: a winner whose backend cannot revive an artefact
(eager, inductor, a CUDA graphs variant), a winner that offers none, any failed check.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import fx

from backends.errors import Unsupported
from backends.registry import offered_revival, registry
from chain.memory import artefacts
from chain.memory.entry import BadEntry, decode, encode
from chain.memory.key import digest, environment, key_parts
from chain.memory.remember import decision_of
from chain.report.records import GraphRecord

FORMAT = 1
MAGIC = b"backend-chain-precompiled"
MAX_ENTRY = 64 * 2**20  # as the store's entries
MAX_ARTEFACT = 4 * 2**30  # as the store's artefacts
EXTRA = "precompiled"  # the decision's extra field: the winner's facts and options


class PrecompileError(RuntimeError):
    """A chain's graph that cannot be saved for torch's precompile, or saved bytes refused
    at load; the message is one line saying why."""


def _no_graph() -> fx.GraphModule:
    """An empty graph: the weights digest of a precompiled artefact covers its inputs only
    (the graph's own tensors are baked into the artefact, and the graph is not kept)."""
    return fx.GraphModule(torch.nn.Module(), fx.Graph())


def _weights(reads: Sequence[int], weights: Mapping[int, Any]) -> list[Any]:
    """An inputs list holding `weights` at `reads` (None elsewhere), for `weights_digest`."""
    out: list[Any] = [None] * (max(reads, default=-1) + 1)
    for i in reads:
        out[i] = weights.get(i)
    return out


def _json(value: Any, what: str) -> Any:
    """`value` as JSON holds it; PrecompileError when it holds something else."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as e:
        raise PrecompileError(f"{what} are not JSON ({e})") from None


def serialize(guard: Any) -> bytes:
    """The bytes of a chain's compiled graph (`GuardedGraph`): its decision and its winner's
    artefact, signed under CHAIN_MEMORY_KEY; PrecompileError saying why it cannot be."""
    chain = guard.chain
    record: GraphRecord = chain.report.graphs[guard.graph_id]
    winner = guard.winner
    where = f"graph {record.id} ({record.origin})"
    backend = registry.lookup(winner) if winner in registry else None
    if backend is None or backend.revive is None:
        raise PrecompileError(
            f"{where}: its winner {winner} cannot be saved: {winner} has no compiled form "
            "another process can run without compiling (only onnxruntime's is)"
        )
    try:
        revival = offered_revival(guard.fn)
    except Unsupported as e:
        raise PrecompileError(f"{where}: its winner {winner} cannot be saved: {e.reason}") from None
    traced = [n.meta.get("example_value") for n in guard.gm.graph.find_nodes(op="placeholder")]
    decides = {"backends": [b.name for b in chain.backends], "mode": chain.mode}
    parts = key_parts(guard.gm, traced, decides)
    key = digest(parts)
    options = _json(chain.options.get(winner, {}), f"{winner}'s options")
    attempts = tuple(
        dataclasses.replace(a, details={}, traceback=None) for a in record.attempts
    )  # details may hold what JSON cannot: the report keeps them, the entry needs none
    decision = decision_of(
        dataclasses.replace(record, winner=winner),  # the guard's winner now
        attempts,
        **{
            EXTRA: {
                "facts": _json(dict(revival.facts), f"{winner}'s facts"),
                "options": options,
                "inputs": len(traced),
            }
        },
    )
    reads = revival.artefact.reads
    weights, why = artefacts.weights_digest(_no_graph(), _weights(reads, revival.weights), reads)
    if weights is None:
        raise PrecompileError(f"{where}: its winner {winner} cannot be saved: {why}")
    try:
        entry = encode(key, parts, decision)
        artefact = artefacts.encode(key, winner, revival.artefact, weights)
    except BadEntry as e:  # CHAIN_MEMORY_KEY set but blank
        raise PrecompileError(f"{where}: not saved: {e}") from None
    head = MAGIC + f" {FORMAT} {len(entry)} {len(artefact)}\n".encode()
    return head + entry + artefact


def _split(data: bytes) -> tuple[bytes, bytes]:
    """The entry's and the artefact's bytes; PrecompileError when the layout is wrong."""
    if not isinstance(data, bytes | bytearray):
        raise PrecompileError(f"precompiled graph refused: {type(data).__name__}, not bytes")
    first = bytes(data[:200]).partition(b"\n")[0]
    fields = first.split(b" ")
    if len(fields) != 4 or fields[0] != MAGIC or not all(f.isdigit() for f in fields[1:]):
        raise PrecompileError("precompiled graph refused: not a backend-chain precompiled graph")
    if fields[1] != str(FORMAT).encode():
        raise PrecompileError(
            f"precompiled graph refused: format {fields[1][:10]!r}, this version reads {FORMAT}"
        )
    n_entry, n_artefact = int(fields[2]), int(fields[3])
    body = bytes(data[len(first) + 1 :])
    if n_entry > MAX_ENTRY or n_artefact > MAX_ARTEFACT or len(body) != n_entry + n_artefact:
        raise PrecompileError("precompiled graph refused: sizes do not match (truncated?)")
    return body[:n_entry], body[n_entry:]


def _environment_change(parts: Mapping[str, Any]) -> str | None:
    """What differs between the environment the graph was saved in and this one."""
    saved = parts.get("environment")
    devices = saved.get("devices") if isinstance(saved, dict) else None
    names = [d.get("device") for d in devices or () if isinstance(d, dict)]
    if not names or not all(isinstance(n, str) for n in names):
        return "its environment is unreadable"
    here = environment(names)
    for field in ("packages", "devices"):
        if saved.get(field) != here[field]:
            return f"saved under other {field} ({json.dumps(saved.get(field))[:160]})"
    return None


def deserialize(data: bytes) -> Loaded:
    """The callable saved by `serialize`, after every check; PrecompileError saying which
    one failed. Nothing is compiled: the winner's backend revives its artefact."""
    entry, stored = _split(data)
    try:
        decision, parts = decode(entry)
        key = json.loads(entry)["key"]
        if digest(parts) != key:
            raise BadEntry("its key is not the digest of its parts (edited)")
        artefact, weights = artefacts.decode(stored, key, decision.winner)
    except BadEntry as e:
        raise PrecompileError(f"precompiled graph refused: {e}") from None
    if why := _environment_change(parts):
        raise PrecompileError(f"precompiled graph refused: {why}; compile it again here")
    saved = decision.extra.get(EXTRA)
    if not isinstance(saved, dict) or not {"facts", "options", "inputs"} <= set(saved):
        raise PrecompileError("precompiled graph refused: its decision holds no revival facts")
    backend = registry.lookup(decision.winner) if decision.winner in registry else None
    if backend is None or backend.revive is None:
        raise PrecompileError(
            f"precompiled graph refused: its winner {decision.winner} cannot be revived here"
        )
    try:
        backend.check_options(saved["options"])
        runner = backend.revive(artefact=artefact.data, facts=saved["facts"], **saved["options"])
    except Unsupported as e:
        raise PrecompileError(f"precompiled graph refused: {e.reason}") from None
    return Loaded(runner, decision.winner, key, artefact.reads, weights, saved["inputs"])


class Loaded:
    """A precompiled graph: the revived winner, whose first call checks the inputs' count
    and that the weights passed are those its artefact holds (their SHA-256)."""

    def __init__(
        self,
        runner: Callable[..., Any],
        winner: str,
        key: str,
        reads: tuple[int, ...],
        weights: str,
        inputs: Any,
    ) -> None:
        self.runner = runner
        self.winner = winner
        self.key = key
        self._reads = reads
        self._weights = weights
        self._inputs = inputs
        self._checked = False
        self._lock = threading.Lock()
        self.chain_details = {"winner": winner, "key": key, "precompiled": True}

    def _check(self, args: Sequence[Any]) -> None:
        with self._lock:
            if self._checked:
                return
            if len(args) != self._inputs:
                raise PrecompileError(
                    f"precompiled {self.winner} graph takes {self._inputs} inputs, got {len(args)}"
                )
            got, why = artefacts.weights_digest(_no_graph(), args, self._reads)
            if got != self._weights:
                raise PrecompileError(
                    f"precompiled {self.winner} graph: the weights passed are not those it "
                    f"was saved with ({why or 'other values'}); compile it again for them"
                )
            self._checked = True

    def __call__(self, *args: Any) -> Any:
        if not self._checked:
            self._check(args)
        return self.runner(*args)
