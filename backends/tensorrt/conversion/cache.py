"""Engine and timing caches on disk, keyed so that a hit is always the right engine.

The key hashes the block's code (graph structure), its constants (weights), the input
specs, the build settings, the TensorRT version, the GPU name and the versions of what
made the engine's input (torch, the ONNX exporter's packages, backend-chain): an upgrade of
any of them is a miss, never a stale engine. Files go through the file layer
(backends.common.files): writes are atomic (an exclusive temporary file + os.replace) and
only ever replace regular files; reads are bounded and refuse links, FIFOs and devices; the
cache folders are created private to the user (0700). An engine is native code: it is read
from checked descriptors (`backends.common.trusted`: the cache folders the user's and
private, their ancestors changeable by no one else), else ignored with a warning. A
corrupt or refused entry is a warning and a miss, never a crash; an entry that cannot be
written is a warning, and the engine just built is used all the same.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import logging
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import fx

from backends.common.files import atomic_write, private_dir, read_bounded
from backends.common.payload import TensorSpec
from backends.common.trusted import read_trusted
from backends.tensorrt.conversion.profiles import Profile

logger = logging.getLogger(__name__)
FORMAT = 3  # 2: toolchain versions in the key; 3: optimization profiles in key and metadata
TOOLCHAIN = ("torch", "onnx", "onnxscript", "backend-chain")
ENGINE_MAX_BYTES = 16 << 30  # an engine of a large model is a few GiB
META_MAX_BYTES = 16 << 20  # names, profiles and a checksum: kilobytes
TIMING_MAX_BYTES = 1 << 30  # tactic timings: megabytes


@functools.cache
def toolchain_versions() -> dict[str, str | None]:
    """The installed versions of what turns a graph into the engine's ONNX input (None: absent)."""
    found: dict[str, str | None] = {}
    for package in TOOLCHAIN:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


def cache_key(
    block: fx.GraphModule,
    inputs: Sequence[TensorSpec],
    settings: Mapping[str, Any],
    trt_version: str,
    device_name: str,
    toolchain: Mapping[str, str | None] | None = None,
    profiles: Sequence[Profile] = (),
) -> str:
    """A hex digest naming the engine built from exactly these ingredients (`toolchain`:
    package versions, default `toolchain_versions()`; `profiles`: its optimization profiles,
    none for an engine fixed at `inputs`)."""
    digest = hashlib.sha256()
    header = {
        "format": FORMAT,
        "toolchain": dict(sorted((toolchain or toolchain_versions()).items())),
        "code": block.code,
        "inputs": [asdict(s) for s in inputs],
        "settings": dict(sorted(settings.items())),
        "tensorrt": trt_version,
        "device": device_name,
        "profiles": [p.to_json() for p in profiles],
    }
    digest.update(json.dumps(header, sort_keys=True).encode())
    constants = {**dict(block.named_parameters()), **dict(block.named_buffers())}
    for name, value in sorted(constants.items()):
        tensor = value.detach().contiguous().cpu().reshape(-1)
        digest.update(f"{name}:{tensor.dtype}:{tuple(value.shape)}".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _ignored(key: str, why: Exception) -> None:
    """Warn that the cache entry `key` is not used, and why (it is rebuilt)."""
    warnings.warn(
        f"ignoring corrupt TensorRT engine cache entry {key[:12]}: {why}; rebuilding",
        RuntimeWarning,
        stacklevel=3,
    )


@dataclass(frozen=True)
class CachedEngine:
    """An engine read back from the cache, with the I/O names it was built with."""

    engine: bytes
    meta: dict[str, Any]


class EngineCache:
    """`<dir>/engines/<key>.engine` + `<key>.json` (I/O names, checksum); the timing cache."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def _paths(self, key: str) -> tuple[Path, Path]:
        base = self.directory / "engines" / key
        return base.with_suffix(".engine"), base.with_suffix(".json")

    def load(self, key: str) -> CachedEngine | None:
        """The cached engine for `key`, or None (a corrupt entry warns and counts as a miss)."""
        engine_path, meta_path = self._paths(key)
        try:  # an engine is native code: read from checked descriptors (common.trusted)
            meta = json.loads(read_trusted(meta_path, META_MAX_BYTES, root=self.directory))
            engine = read_trusted(engine_path, ENGINE_MAX_BYTES, root=self.directory)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:  # UnsafeFile (a link, FIFO, device) is an OSError
            _ignored(key, e)
            return None
        try:
            if not isinstance(meta, dict) or meta.get("format") != FORMAT:
                raise ValueError(f"unexpected metadata format in {meta_path}")
            if hashlib.sha256(engine).hexdigest() != meta.get("sha256"):
                raise ValueError(f"checksum mismatch for {engine_path}")
        except ValueError as e:
            _ignored(key, e)
            return None
        return CachedEngine(engine, meta)

    def store(self, key: str, engine: bytes, meta: Mapping[str, Any]) -> None:
        """Save an engine and its metadata (engine first: the metadata makes it visible);
        one that cannot be saved (a refused path, a full disk) is a warning, not a failure."""
        engine_path, meta_path = self._paths(key)
        full = {**meta, "format": FORMAT, "sha256": hashlib.sha256(engine).hexdigest()}
        try:
            private_dir(engine_path.parent)
            atomic_write(engine_path, engine)
            atomic_write(meta_path, json.dumps(full, indent=1).encode())
        except OSError as e:
            warnings.warn(
                f"TensorRT engine {key[:12]} not cached: {e}", RuntimeWarning, stacklevel=2
            )

    @property
    def timing_cache_path(self) -> Path:
        return self.directory / "timing.cache"

    def read_timing_cache(self) -> bytes:
        """The serialized timing cache, or b"" when there is none or it cannot be read."""
        try:
            return read_bounded(self.timing_cache_path, TIMING_MAX_BYTES)
        except FileNotFoundError:
            return b""
        except OSError as e:
            warnings.warn(f"cannot read TensorRT timing cache: {e}", RuntimeWarning, stacklevel=2)
            return b""

    def write_timing_cache(self, data: bytes) -> None:
        """Save the serialized timing cache (the cache folder is created, private, when
        missing); one that cannot be saved is a warning."""
        try:
            private_dir(self.timing_cache_path.parent)
            atomic_write(self.timing_cache_path, data)
        except OSError as e:
            warnings.warn(f"TensorRT timing cache not saved: {e}", RuntimeWarning, stacklevel=2)
