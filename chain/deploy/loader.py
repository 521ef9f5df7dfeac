"""`chain.load(path)`: torch.export.load with the checks a deployed program needs.

Before torch reads the file: it must be a whole zip archive (every entry's CRC checked),
it must hold no pickled objects (torch.export.load would unpickle them: arbitrary code),
its sample inputs must load with `weights_only=True` (else torch falls back to a full
unpickle), and every class its inputs and outputs are made of must be registered with
pytree here (transformers output classes: import `transformers.modeling_outputs`). After:
every payload is unpacked, hash-checked, checked against the digest its node was built
with, and (CPU payloads) its runner built, so a swapped or damaged payload fails at load, not at the
first call. Every failure is a `PayloadError` with one line. The program returned is a
`LoadedProgram`: its `module()` runs the graph behind a cheap input check of our own.
"""

from __future__ import annotations

import io
import json
import zipfile
import zlib
from collections.abc import Iterator
from os import PathLike
from typing import Any

import torch
from torch.utils import _pytree as pytree

from backends.common.payload import (
    PayloadError,
    PayloadMismatch,
    RuntimeMissing,
    binding_from_str,
    check_binding,
    tensor_bytes,
    unpack,
    verify_body,
)
from chain.deploy import ops
from chain.deploy.program import LoadedProgram, as_loaded

_PICKLED_PREFIXES = ("custom_obj", "opaque_obj")  # torch.export.load unpickles these
_CONFIGS = ("model_weights_config.json", "model_constants_config.json")


def load(path: str | PathLike[str]) -> LoadedProgram:
    """Load a program saved by `torch.export.save(chain.export(...).program, path)`, checked.

    Raises `PayloadError` (one line) for a file that is damaged, not a program, holds
    pickled objects, or whose payloads are not the ones it was built with (`PayloadMismatch`).
    Its `module()` is the lean callable (`chain.deploy.program`), `module(lean=False)` torch's.
    """
    name = str(path)
    _check_archive(name)
    try:
        program = torch.export.load(name)
    except (RuntimeError, ValueError, KeyError, OSError, EOFError, zlib.error) as error:
        first = next((s for s in str(error).splitlines() if s.strip()), type(error).__name__)
        raise PayloadError(f"{name}: torch.export.load failed: {first[:200]}") from error
    _check_payloads(name, program)
    return as_loaded(program)


def _check_archive(name: str) -> None:
    """The zip is whole, holds no pickles, and names only pytree types registered here."""
    try:
        with zipfile.ZipFile(name) as archive:
            bad = archive.testzip()
            if bad is not None:
                raise PayloadError(f"{name}: corrupted (checksum mismatch in {bad})")
            for entry in archive.namelist():
                _check_entry(name, archive, entry)
    except FileNotFoundError:
        raise PayloadError(f"{name}: no such file") from None
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError) as error:
        raise PayloadError(
            f"{name}: not a readable .pt2 program (truncated or corrupted zip: {error})"
        ) from None


def _check_entry(name: str, archive: zipfile.ZipFile, entry: str) -> None:
    """Refuse pickled objects and unknown pytree types in one archive entry."""
    leaf = entry.rsplit("/", 1)[-1]
    legacy = leaf.endswith(".pt") and ("/weights/" in entry or "/constants/" in entry)
    if leaf.startswith(_PICKLED_PREFIXES) or legacy:
        raise PayloadError(f"{name}: holds a pickled object ({entry}): refused, not loaded")
    if leaf in _CONFIGS:
        config = json.loads(archive.read(entry)).get("config", {})
        pickled = [fqn for fqn, meta in config.items() if meta.get("use_pickle")]
        if pickled:
            raise PayloadError(f"{name}: holds pickled tensors ({pickled[0]}): refused")
    elif "/sample_inputs/" in entry:
        try:
            torch.load(io.BytesIO(archive.read(entry)), weights_only=True)
        except Exception as error:  # the unpickler raises many types; all mean "refused"
            first = str(error).splitlines()[0][:160] if str(error) else type(error).__name__
            raise PayloadError(
                f"{name}: its sample inputs need a full unpickle ({first}): refused"
            ) from None
    elif "/models/" in entry and leaf.endswith(".json"):
        _check_pytree_types(name, json.loads(archive.read(entry)))


def _specs(data: Any) -> Iterator[str]:
    """The serialized treespecs (`in_spec`, `out_spec`) anywhere in a model's JSON."""
    if isinstance(data, dict):
        for key, value in data.items():
            if key in ("in_spec", "out_spec") and isinstance(value, str):
                yield value
            else:
                yield from _specs(value)
    elif isinstance(data, list):
        for value in data:
            yield from _specs(value)


def _types(spec: Any) -> Iterator[str]:
    if isinstance(spec, dict):
        if isinstance(spec.get("type"), str):
            yield spec["type"]
        for child in spec.get("children_spec", ()):
            yield from _types(child)
    elif isinstance(spec, list):
        for value in spec:
            yield from _types(value)


def _check_pytree_types(name: str, model: Any) -> None:
    """Every class the program's inputs and outputs use must be registered with pytree."""
    for text in _specs(model):
        for type_name in _types(json.loads(text)):
            if type_name in pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE:
                continue
            module = type_name.rsplit(".", 1)[0]
            raise PayloadError(
                f"{name}: its inputs or outputs are {type_name}, not registered in this "
                f"process: import {module} before loading"
            )


def _check_payloads(name: str, program: torch.export.ExportedProgram) -> None:
    """Unpack, hash-check and bind-check every payload; build the runners of CPU payloads."""
    constants = program.constants
    inputs = {spec.arg.name: spec.target for spec in program.graph_signature.input_specs}
    for node in program.graph.nodes:
        if node.target is not torch.ops.backend_chain.run_payload.default:
            continue
        payload_node, outputs = node.args[1], node.args[2]
        target = inputs.get(payload_node.name)
        payload = constants.get(target) if target is not None else None
        if not isinstance(payload, torch.Tensor):
            raise PayloadError(f"{name}: payload of {node.name} is missing from the program")
        try:
            data = tensor_bytes(payload)
            check_binding(binding_from_str(outputs), data)
            header, body = unpack(data)
            verify_body(header, body)
            if header.device == "cpu":  # build the session now: its first call is free
                ops.runner_for(payload, torch.device("cpu"), outputs)
        except RuntimeMissing:
            raise
        except PayloadMismatch as error:
            raise PayloadMismatch(f"{name}: {error}") from None
        except PayloadError as error:
            raise PayloadError(f"{name}: {error}") from None
