"""Artefacts kept with remembered decisions: what a winner's backend compiled (ONNX
Runtime's exported model), so that a warm start skips the expensive step (the export).

An artefact is stored under its decision's key in the store's artefact space. Its stored
form is a first line `backend-chain-artefact <format> <header length>`, a JSON header and
the backend's bytes. The header holds the backend, the key, the SHA-256 of the bytes and
of the weights baked into them (`Artefact.reads` and the graph's own tensors), a digest of
itself and, under CHAIN_MEMORY_KEY, an HMAC: the same checks as entries. An artefact that
fails one, or was made for other weights, is ignored with a note: the backend compiles as
usual, and the new artefact replaces it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import operator
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from backends.errors import InvalidOption
from backends.registry import Artefact
from chain.memory.entry import SIGNING_KEY_ENV, BadEntry, load_json, same_digest, signing_key

FORMAT = 1
MAGIC = b"backend-chain-artefact"
MAX_MB_ENV = "CHAIN_ARTEFACT_MAX_MB"  # artefacts above this many MiB are not stored
DEFAULT_MAX_MB = 512.0
MAX_MB = 2**20  # a TiB, as the max_artefact_mb option


def max_bytes(option: float | None) -> int:
    """The size bound: the chain's `max_artefact_mb`, else CHAIN_ARTEFACT_MAX_MB, else 512
    MiB; 0 stores no artefacts. A bad env value is a one-line InvalidOption at chain()."""
    if option is None:
        text = os.environ.get(MAX_MB_ENV)
        option = _env_mb(text) if text else DEFAULT_MAX_MB
    return int(option * 2**20)


def _env_mb(text: str) -> float:
    """CHAIN_ARTEFACT_MAX_MB's value: a finite number of MiB from 0 to MAX_MB."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 <= value <= MAX_MB):
        raise InvalidOption(
            f"{MAX_MB_ENV}={text[:40]!r}: expected a number of MiB from 0 to {MAX_MB} "
            "(0: no artefacts)"
        )
    return value


def _hash_tensor(h: Any, tensor: torch.Tensor) -> None:
    h.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
    flat = tensor.detach().reshape(-1).contiguous().cpu()
    h.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")


def _hash_module(h: Any, gm: fx.GraphModule) -> str | None:
    """Hash the tensors the graph reads from itself (get_attr); why not, if it cannot."""
    for node in gm.graph.find_nodes(op="get_attr"):
        value = operator.attrgetter(node.target)(gm)
        h.update(str(node.target).encode())
        if isinstance(value, fx.GraphModule):
            if (why := _hash_module(h, value)) is not None:
                return why
        elif type(value) in (torch.Tensor, torch.nn.Parameter):
            _hash_tensor(h, value)
        else:
            return f"the graph reads {node.target} ({type(value).__name__}), which is not hashed"
    return None


def weights_digest(
    gm: fx.GraphModule, inputs: Sequence[Any], reads: Sequence[int]
) -> tuple[str | None, str]:
    """(digest, "") of the weights an artefact bakes in: the inputs at `reads` and the
    graph's own tensors; (None, why) when one cannot be hashed (no artefact then)."""
    h = hashlib.sha256()
    for i in reads:
        value = inputs[i] if i < len(inputs) else None
        if type(value) not in (torch.Tensor, torch.nn.Parameter):
            return None, f"input {i} it bakes in is a {type(value).__name__}, not hashed"
        h.update(f"input {i}".encode())
        _hash_tensor(h, value)  # type: ignore[arg-type]
    if (why := _hash_module(h, gm)) is not None:
        return None, why
    return h.hexdigest(), ""


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def encode(key: str, backend: str, artefact: Artefact, weights: str) -> bytes:
    """The stored form of `artefact` for decision `key`, digested and maybe signed."""
    body = {
        "format": FORMAT,
        "key": key,
        "backend": backend,
        "reads": list(artefact.reads),
        "weights": weights,
        "size": len(artefact.data),
        "data_sha256": hashlib.sha256(artefact.data).hexdigest(),
    }
    raw = _canonical(body)
    secret = signing_key()
    header = dict(
        body,
        digest=hashlib.sha256(raw).hexdigest(),
        signature=hmac.new(secret, raw, "sha256").hexdigest() if secret else None,
    )
    text = json.dumps(header, sort_keys=True).encode()
    return MAGIC + f" {FORMAT} {len(text)}\n".encode() + text + artefact.data


_NAMES = ("format", "key", "backend", "reads", "weights", "size", "data_sha256")


def _header(data: bytes) -> tuple[dict[str, Any], bytes]:
    """The artefact's header, its fields' types checked, and the bytes after it; BadEntry
    saying which check failed."""
    first, _, rest = data.partition(b"\n")
    fields = first.split(b" ")
    if len(fields) != 3 or fields[0] != MAGIC or not fields[2].isdigit():
        raise BadEntry("not an artefact (first line unreadable)")
    if fields[1] != str(FORMAT).encode():
        raise BadEntry(f"artefact format {fields[1][:20]!r}, this version reads {FORMAT}")
    size = int(fields[2])
    header = load_json(rest[:size], "artefact header not JSON")
    if not isinstance(header, dict) or not {*_NAMES, "digest"} <= set(header):
        raise BadEntry("not an artefact header (fields missing)")
    texts = ("key", "backend", "weights", "data_sha256", "digest")
    wrong = [n for n in texts if not isinstance(header[n], str)]
    if type(header["size"]) is not int or header["size"] < 0:
        wrong.append("size")
    reads = header["reads"]
    if not isinstance(reads, list) or any(type(i) is not int or i < 0 for i in reads):
        wrong.append("reads")
    if wrong:
        raise BadEntry(f"artefact header field(s) of the wrong type: {', '.join(wrong)}")
    return header, rest[size:]


def decode(data: bytes, key: str, backend: str) -> tuple[Artefact, str]:
    """The artefact and its weights digest; BadEntry saying which check failed."""
    header, body = _header(data)
    raw = _canonical({k: header[k] for k in _NAMES})
    if not same_digest(header["digest"], hashlib.sha256(raw).hexdigest()):
        raise BadEntry("artefact header digest does not match (corrupt or edited)")
    secret = signing_key()
    if secret is not None:
        signature = header.get("signature")
        if not isinstance(signature, str):
            raise BadEntry(f"artefact not signed, and {SIGNING_KEY_ENV} is set")
        if not same_digest(signature, hmac.new(secret, raw, "sha256").hexdigest()):
            raise BadEntry(f"artefact signature does not match under {SIGNING_KEY_ENV}")
    if len(body) != header["size"] or not same_digest(
        header["data_sha256"], hashlib.sha256(body).hexdigest()
    ):
        raise BadEntry("artefact bytes do not match their digest (corrupt or tampered)")
    if header["key"] != key or header["backend"] != backend:
        raise BadEntry(f"made for {header['backend'][:60]!r} under {header['key'][:64]!r}")
    return Artefact(body, tuple(header["reads"])), header["weights"]
