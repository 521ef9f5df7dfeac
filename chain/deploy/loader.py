"""`chain.load(path)`: torch's program loader behind one strict reader of the archive.

A `.pt2` is data from a stranger until checked, and torch's loader unpickles (runs code
from) several of its parts: constants whose `path_name` starts with `custom_obj_` or
`opaque_obj_` (in any folder), pickled weights and constants (`use_pickle`), legacy
`<model>.pt` weight files, sample inputs that need more than `weights_only`, an AOTInductor
folder (a shared library), and the graph's `guards_code` (Python source, exec'd by
`module()`). So the file is read once (a regular file, bounded), and those bytes are
checked against an allowlist of what `torch.export.save` writes for a program of
`chain.export` (or a plain `torch.export` program) before torch sees them: fixed entry
names under one root folder, raw tensor files `weight_<i>` / `tensor_<i>` named by
configs of exactly torch's shape and matching the graph's own tensor metadata, call
targets from aten / prims / our op / arithmetic, guards that are size arithmetic, input
and output classes registered here or recorded with their field names (`structure.py`:
stand-ins, one warning; nothing imported on the file's say-so). Torch
then reads the same bytes from memory (no second open, no legacy fallback). After:
every payload is unpacked, hash-checked, checked against the digest its node was built
with, and (CPU payloads) its runner built. Every failure is a `PayloadError` with one
line. The program returned is a `LoadedProgram`: its `module()` runs the graph behind a
cheap input check of our own.
"""

from __future__ import annotations

import io
import json
import re
import warnings
import zipfile
import zlib
from collections.abc import Iterator
from os import PathLike
from typing import Any

import torch

import chain.deploy.ops as ops
import chain.deploy.structure as structure
from backends.common.files import read_bounded
from backends.common.payload import (
    PayloadError,
    PayloadMismatch,
    RuntimeMissing,
    binding_from_str,
    check_binding,
    specs_from_str,
    tensor_bytes,
    unpack,
    verify_body,
)
from chain.deploy.model_json import CONSTANTS, WEIGHTS, check_model, refuse
from chain.deploy.program import LoadedProgram, as_loaded

MAX_PROGRAM_BYTES = 64 << 30  # a bound, not a budget: refuses /dev/zero and growing files
_ROOT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")
_REQUIRED = {
    "archive_format": b"pt2",
    "archive_version": b"0",
    "models/model.json": None,
    "data/sample_inputs/model.pt": None,
    f"{WEIGHTS}model_weights_config.json": None,
    f"{CONSTANTS}model_constants_config.json": None,
}
_OPTIONAL = ("byteorder", ".data/version", ".data/serialization_id")
_TENSOR_FILE = re.compile(r"(data/weights/weight|data/constants/tensor)_(0|[1-9][0-9]{0,8})")
_META_KEYS = {"path_name", "is_param", "use_pickle", "tensor_meta"}


def load(path: str | PathLike[str]) -> LoadedProgram:
    """Load a program saved by `torch.export.save(chain.export(...).program, path)`, checked.

    Raises `PayloadError` (one line) for a file that is damaged, not a program, holds
    anything the strict reader does not allow (pickles, code, unknown entries), or whose
    payloads are not the ones it was built with (`PayloadMismatch`).
    Its `module()` is the lean callable (`chain.deploy.program`), `module(lean=False)` torch's.
    """
    name = str(path)
    data = _read(name)
    served = _check_archive(name, data)
    program = _torch_load(name, data)
    _check_payloads(name, program)
    if served:
        warnings.warn(structure.warning_text(served), structure.StandInWarning, stacklevel=2)
    return as_loaded(program)


def _read(name: str) -> bytes:
    """The file's bytes, read once: a regular file (not a FIFO or device), bounded."""
    try:
        return read_bounded(name, MAX_PROGRAM_BYTES, follow_symlinks=True)
    except FileNotFoundError:
        raise PayloadError(f"{name}: no such file") from None
    except OSError as error:  # UnsafeFile included: a folder, FIFO, device, too large
        raise PayloadError(f"{name}: not readable ({_line(error)})") from None


def _line(error: BaseException) -> str:
    """The first non-empty line of an error, bounded, or its class name."""
    first = next((s for s in str(error).splitlines() if s.strip()), type(error).__name__)
    return first[:200]


def _torch_load(name: str, data: bytes) -> torch.export.ExportedProgram:
    """Torch's reader over the checked bytes: `load_pt2` itself, so that a failure is an
    error and never torch.export.load's fallback to the older (pickling) zip format."""
    from torch.export.pt2_archive._package import load_pt2

    try:
        return load_pt2(io.BytesIO(data)).exported_programs["model"]
    except PayloadError as error:
        raise PayloadError(f"{name}: {error}") from None
    except Exception as error:  # torch's deserializer raises many types on malformed data
        raise PayloadError(f"{name}: torch.export.load failed: {_line(error)}") from error


def _check_archive(name: str, data: bytes) -> list[str]:
    """The zip is whole and holds only what a saved program holds (see the module doc);
    returns the classes of its inputs and outputs served by stand-ins (`structure.py`)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            bad = archive.testzip()
            if bad is not None:
                raise PayloadError(f"{name}: corrupted (checksum mismatch in {bad})")
            root, entries = _entries(name, archive, data)
            try:
                return _check_contents(name, archive, root, entries)
            except (KeyError, TypeError, AttributeError, ValueError, RecursionError) as error:
                what = f"{type(error).__name__}: {_line(error)[:80]}"
                raise refuse(name, f"a program of another shape ({what})") from None
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, KeyError) as error:
        raise PayloadError(
            f"{name}: not a readable .pt2 program (truncated or corrupted zip: {_line(error)})"
        ) from None


def _entries(name: str, archive: zipfile.ZipFile, data: bytes) -> tuple[str, dict[str, int]]:
    """The archive's one root folder and its entries (relative name -> size), each stored
    uncompressed, unencrypted, named once, at the offsets torch's reader will use."""
    infos = archive.infolist()
    if not infos or not data.startswith(b"PK\x03\x04") or min(i.header_offset for i in infos):
        raise refuse(name, "not a plain zip archive (data before its first entry)")
    root = infos[0].filename.split("/", 1)[0]
    if not _ROOT.fullmatch(root):
        raise refuse(name, f"an archive root folder named {root[:60]!r}")
    entries: dict[str, int] = {}
    for info in infos:
        rel = info.filename[len(root) + 1 :]
        if not info.filename.startswith(root + "/") or not _allowed_entry(rel):
            raise refuse(name, f"an entry this reader does not allow ({info.filename[:120]!r})")
        if rel in entries:
            raise refuse(name, f"the entry {info.filename[:120]!r} twice")
        if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
            raise refuse(name, f"a compressed or encrypted entry ({info.filename[:120]!r})")
        entries[rel] = info.file_size
    missing = sorted(set(_REQUIRED) - set(entries))
    if missing:
        raise refuse(name, f"not a saved program (no {missing[0]})")
    return root, entries


def _allowed_entry(rel: str) -> bool:
    """Whether `rel` (a name under the root folder) is one `torch.export.save` writes."""
    return rel in _REQUIRED or rel in _OPTIONAL or _TENSOR_FILE.fullmatch(rel) is not None


def _check_contents(
    name: str, archive: zipfile.ZipFile, root: str, entries: dict[str, int]
) -> list[str]:
    """Fixed values, the model's JSON, both configs against it, the sample inputs, the
    input and output structures; returns the classes served by stand-ins."""
    for rel, value in _REQUIRED.items():
        if value is not None and archive.read(f"{root}/{rel}") != value:
            raise refuse(name, f"{rel} is not {value.decode()!r}")
    model = _json(name, archive.read(f"{root}/models/model.json"), "models/model.json")
    lifted = check_model(name, model)
    used: set[str] = set()
    for folder, prefix, config_name in (
        (WEIGHTS, "weight_", "model_weights_config.json"),
        (CONSTANTS, "tensor_", "model_constants_config.json"),
    ):
        raw = archive.read(f"{root}/{folder}{config_name}")
        config = _config(name, _json(name, raw, config_name), config_name)
        used |= _check_config(name, config, folder, prefix, lifted, entries)
    unused = sorted(rel for rel in entries if _TENSOR_FILE.fullmatch(rel) and rel not in used)
    if unused:
        raise refuse(name, f"a tensor file no config names ({unused[0]})")
    _check_sample_inputs(name, archive.read(f"{root}/data/sample_inputs/model.pt"))
    return structure.prepare(name, list(_specs(model)))


def _json(name: str, raw: bytes, entry: str) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        raise refuse(name, f"{entry} is not JSON ({_line(error)})") from None


def _config(name: str, data: Any, entry: str) -> dict[str, dict[str, Any]]:
    """A payload config of exactly torch's shape: {"config": {fqn: {4 known keys}}}."""
    if not isinstance(data, dict) or set(data) != {"config"}:
        raise refuse(name, f"{entry} is not a {{'config': {{...}}}} object")
    config = data["config"]
    if not isinstance(config, dict):
        raise refuse(name, f"{entry}: its config is a {type(config).__name__}, not an object")
    for fqn, meta in config.items():
        if not isinstance(meta, dict) or set(meta) != _META_KEYS:
            raise refuse(name, f"{entry}: {fqn[:80]!r} is not a payload entry of torch's shape")
        if meta["use_pickle"] is not False:
            raise refuse(name, f"{entry}: {fqn[:80]!r} is pickled (use_pickle)")
        if not isinstance(meta["is_param"], bool) or not isinstance(meta["path_name"], str):
            raise refuse(name, f"{entry}: {fqn[:80]!r} has fields of the wrong type")
    return config


def _check_config(
    name: str,
    config: dict[str, dict[str, Any]],
    folder: str,
    prefix: str,
    lifted: dict[str, tuple[str, Any]],
    entries: dict[str, int],
) -> set[str]:
    """Each entry is a raw tensor file `<prefix><i>` of this folder, numbered in order of
    first use, big enough, described as the graph describes the same input; returns the
    tensor files used. Anything else (opaque_obj_, custom_obj_, sub-folders) is refused."""
    order: list[str] = []
    for fqn, meta in config.items():
        path_name = meta["path_name"]
        if not re.fullmatch(f"{prefix}(0|[1-9][0-9]{{0,8}})", path_name):
            raise refuse(name, f"{folder}: {fqn[:80]!r} names {path_name[:80]!r}, not a tensor")
        if path_name not in order:
            if path_name != f"{prefix}{len(order)}":
                raise refuse(name, f"{folder}: tensor files out of order ({path_name})")
            order.append(path_name)
        where, expected = lifted.get(fqn, ("", None))
        if where != folder or meta["tensor_meta"] != expected:
            raise refuse(name, f"{folder}: {fqn[:80]!r} is not described as the graph's input")
        _check_size(name, folder + path_name, entries.get(folder + path_name), expected)
    return {folder + p for p in order}


def _check_size(name: str, entry: str, size: int | None, meta: dict[str, Any]) -> None:
    """The tensor file holds the elements its description reaches (torch would read an
    empty file as zeros and a short one as an error at load)."""
    from torch._export.serde.serialize import _SERIALIZE_TO_TORCH_DTYPE, ScalarType

    if size is None:
        raise refuse(name, f"no {entry} in the archive")
    try:
        dtype = _SERIALIZE_TO_TORCH_DTYPE[ScalarType(meta["dtype"])]
        sizes = [int(s["as_int"]) for s in meta["sizes"]]
        strides = [int(s["as_int"]) for s in meta["strides"]]
        last = int(meta["storage_offset"]["as_int"])
        last += sum((n - 1) * s for n, s in zip(sizes, strides, strict=True))
    except (KeyError, TypeError, ValueError):
        raise refuse(name, f"the description of {entry} is malformed") from None
    needed = 0 if 0 in sizes else (last + 1) * dtype.itemsize
    if size < needed or size % dtype.itemsize:
        raise refuse(name, f"{entry} holds {size} bytes, its tensor needs {needed}")


def _check_sample_inputs(name: str, raw: bytes) -> None:
    """Torch loads the sample inputs with `weights_only=True` and, if that fails, with a
    full unpickle: they must load the first way, as the tuple or dict torch expects."""
    if not raw:
        return
    try:
        value = torch.load(io.BytesIO(raw), weights_only=True)
    except Exception as error:  # the unpickler raises many types; all mean "refused"
        raise refuse(name, f"its sample inputs need a full unpickle ({_line(error)})") from None
    if not isinstance(value, (tuple, dict)):
        raise refuse(name, f"its sample inputs are a {type(value).__name__}")


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
            _check_declared(header, outputs)
            if header.device == "cpu":  # build the session now: its first call is free
                runner = ops.runner_for(payload, torch.device("cpu"), outputs)
                ops.check_bound_inputs(runner, _input_specs(node.args[0]), node.name)
        except RuntimeMissing:
            raise
        except PayloadMismatch as error:
            raise PayloadMismatch(f"{name}: {error}") from None
        except PayloadError as error:
            raise PayloadError(f"{name}: {error}") from None


def _check_declared(header: Any, outputs: str) -> None:
    """The outputs the node declares are the ones the payload's header names (count,
    shape, dtype): an edited declaration is refused at load, not met at a call."""
    declared = [s.to_json() for s in specs_from_str(outputs)]
    named = [s.to_json() for s in header.outputs]
    if declared != named:
        raise PayloadMismatch(
            f"the program declares outputs {declared[:3]} for a payload whose header says "
            f"{named[:3]}: refused (edited program or swapped payload)"
        )


def _input_specs(args: Any) -> list[tuple[list[int], str, list[int]]]:
    """Shape, dtype and strides of a payload call's inputs, as the program's graph says."""
    specs = []
    for arg in args:
        value = getattr(arg, "meta", {}).get("val")
        if not isinstance(value, torch.Tensor):
            specs.append(([], type(value).__name__, []))
            continue
        shape, stride = list(value.shape), list(value.stride())
        if not all(type(s) is int for s in (*shape, *stride)):
            shape, stride = [-1], [-1]  # symbolic sizes: no static binding matches them
        specs.append((shape, str(value.dtype).removeprefix("torch."), stride))
    return specs
