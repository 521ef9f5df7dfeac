"""The payload of a compiled part: a self-describing byte string (header + model or engine).

Layout: `MAGIC` (8 bytes), header length (4 bytes, little endian), header (UTF-8 JSON),
body (what the backend's loader reads: an ONNX model, a serialized TensorRT engine). The
header says what built the body (the registered backend's name, its version, opset, GPU),
the body's SHA-256 (the cache key of loaded sessions and engines, checked once at load),
and the I/O names and output specs. In a program the payload is a uint8 tensor constant;
`to_tensor` / `tensor_bytes` convert. A backend's export hooks build headers; its loader
raises `RuntimeMissing` or `PayloadMismatch` with one line naming what to do.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import json
import struct
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

MAGIC = b"BCHAIN1\0"
_PREFIX = len(MAGIC) + 4
GPU_EXTRA = "pip install 'backend-chain[gpu]'"
CPU_EXTRA = "pip install 'backend-chain[cpu]'"


class PayloadError(RuntimeError):
    """A payload that cannot be read: not ours, truncated, or corrupted."""


class RuntimeMissing(PayloadError):
    """The payload's runtime (tensorrt, onnxruntime, a CUDA device) is not here."""


class PayloadMismatch(PayloadError):
    """The payload was built by a runtime this process cannot honour (version, GPU), or is
    not the payload its program was built with (swapped)."""


@dataclass(frozen=True)
class SizeOf:
    """An output size that follows the inputs' (a part exported with dynamic axes):
    `coefficient` times the product of the sizes `(input, dim)` of the payload's inputs."""

    coefficient: int
    factors: tuple[tuple[int, int], ...]

    def to_json(self) -> dict[str, Any]:
        return {"c": self.coefficient, "of": [list(f) for f in self.factors]}

    @classmethod
    def from_json(cls, data: Any) -> SizeOf:
        """Read as data: small integers only (a bad one is a PayloadError)."""
        try:
            factors = tuple((int(k), int(d)) for k, d in data["of"])
            ok = isinstance(data["c"], int) and all(
                isinstance(v, int) and 0 <= v < 1 << 16 for f in data["of"] for v in f
            )
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok or set(data) != {"c", "of"} or not 0 < data["c"] < 1 << 31:
            raise PayloadError(f"unreadable dynamic output size {str(data)[:80]!r}")
        return cls(data["c"], factors)

    def of(self, inputs: Sequence[torch.Tensor]) -> Any:
        """The size for these inputs (a SymInt for fake ones)."""
        size: Any = self.coefficient
        for k, d in self.factors:
            size = size * inputs[k].shape[d]
        return size


Dim = int | SizeOf


def _dim_json(dim: Dim) -> Any:
    return dim.to_json() if isinstance(dim, SizeOf) else int(dim)


def _dim_from(value: Any) -> Dim:
    return value if isinstance(value, int) else SizeOf.from_json(value)


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of one tensor: a payload's output, an engine's input (cache key).
    A dynamic part's output sizes may follow its inputs' (`SizeOf`)."""

    shape: tuple[Dim, ...]
    dtype: str  # torch dtype name without the "torch." prefix

    @classmethod
    def of(cls, tensor: torch.Tensor) -> TensorSpec:
        return cls(tuple(int(s) for s in tensor.shape), str(tensor.dtype).removeprefix("torch."))

    @property
    def static(self) -> bool:
        """Whether every size is a number (else some follow the inputs')."""
        return all(isinstance(d, int) for d in self.shape)

    def sizes(self, inputs: Sequence[torch.Tensor]) -> list[Any]:
        """The sizes for these inputs."""
        return [d.of(inputs) if isinstance(d, SizeOf) else d for d in self.shape]

    def to_json(self) -> dict[str, Any]:
        return {"shape": [_dim_json(d) for d in self.shape], "dtype": self.dtype}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TensorSpec:
        return cls(tuple(_dim_from(d) for d in data["shape"]), data["dtype"])

    @property
    def torch_dtype(self) -> torch.dtype:
        dtype = getattr(torch, self.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise PayloadError(f"unknown output dtype {self.dtype!r}")
        return dtype


def specs_to_str(
    specs: list[TensorSpec], part: str = "", sha256: str = "", program: str = ""
) -> str:
    """The op's string argument (JSON): output specs, and the part and payload it is bound to.

    `sha256` is the digest of the whole payload (header and body) the program's node was
    built with; the payload is checked against it when it is loaded (`check_binding`).
    `program`: the id a signed payload's binding names (its signature covers it), if any.
    """
    outputs = [s.to_json() for s in specs]
    if not sha256:
        return json.dumps(outputs)
    data: dict[str, Any] = {"part": part, "sha256": sha256, "outputs": outputs}
    if program:
        data["program"] = program
    return json.dumps(data)


@dataclass(frozen=True)
class Binding:
    """What a program's node says about its payload: the part's name, the payload digest and
    the program id a signed payload's binding must name."""

    part: str
    sha256: str  # empty for programs exported before payloads were bound
    program: str = ""


def _parse(text: str) -> tuple[Binding, list[dict[str, Any]]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise PayloadError(f"payload call has unreadable output specs: {error}") from None
    if isinstance(data, list):
        return Binding("", ""), data
    binding = Binding(
        str(data.get("part", "")), str(data.get("sha256", "")), str(data.get("program", ""))
    )
    return binding, data["outputs"]


def specs_from_str(text: str) -> list[TensorSpec]:
    """The output specs of `specs_to_str`'s string."""
    return list(declared_specs(text))


@functools.lru_cache(maxsize=512)
def declared_specs(text: str) -> tuple[TensorSpec, ...]:
    """The output specs of `specs_to_str`'s string, parsed once per string (checked per call)."""
    try:
        return tuple(TensorSpec.from_json(d) for d in _parse(text)[1])
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise PayloadError(f"payload call has unreadable output specs: {error}") from None


def check_outputs(
    results: Sequence[torch.Tensor], text: str, inputs: Sequence[torch.Tensor], part: str = ""
) -> None:
    """PayloadMismatch unless `results` are what the program's node declares (count, shape,
    dtype): a payload never answers with tensors its program did not declare."""
    specs = declared_specs(text)
    if len(results) != len(specs):
        raise PayloadMismatch(
            f"payload of part {part or '?'} returned {len(results)} outputs, its program "
            f"declares {len(specs)}: refused"
        )
    for k, (got, spec) in enumerate(zip(results, specs, strict=True)):
        want = spec.sizes(inputs) if not spec.static else list(spec.shape)
        if str(got.dtype).removeprefix("torch.") != spec.dtype or list(got.shape) != want:
            raise PayloadMismatch(
                f"payload of part {part or '?'} output {k} is {tuple(got.shape)} "
                f"{str(got.dtype).removeprefix('torch.')}, its program declares "
                f"{tuple(want)} {spec.dtype}: refused (edited program or swapped payload)"
            )


def binding_from_str(text: str) -> Binding:
    """The part and payload digest of `specs_to_str`'s string."""
    return _parse(text)[0]


def check_binding(binding: Binding, payload: bytes | memoryview) -> None:
    """Raise PayloadMismatch when `payload` is not the one the program's node was built with."""
    if not binding.sha256:
        return
    actual = digest(payload)
    if actual != binding.sha256:
        raise PayloadMismatch(
            f"payload of part {binding.part or '?'} is not the one this program was built "
            f"with (sha256 {actual[:12]}, the program says {binding.sha256[:12]}): the file "
            "was modified or its payload swapped; export the model again"
        )


@dataclass(frozen=True)
class Header:
    """What built a payload and how to feed it."""

    backend: str  # the registered backend whose loader runs the body: "onnxruntime", ...
    version: str  # the backend's version at build time
    sha256: str  # of the body
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    outputs: tuple[TensorSpec, ...]
    opset: int | None = None  # ONNX opset of the model (the engine's ONNX for TensorRT)
    device: str = "cpu"  # where it was built and verified: "cpu", "cuda"
    gpu: str | None = None  # GPU name, for engines
    compute_capability: str | None = None  # "9.0", for engines
    torch: str = field(default_factory=lambda: str(torch.__version__))

    def to_json(self) -> str:
        data = asdict(self)
        data["outputs"] = [o.to_json() for o in self.outputs]
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Header:
        data: dict[str, Any] = json.loads(text)
        if not isinstance(data.get("backend"), str):
            raise PayloadError(f"payload header names no backend: {text[:80]!r}")
        data["input_names"] = tuple(data["input_names"])
        data["output_names"] = tuple(data["output_names"])
        data["outputs"] = tuple(TensorSpec.from_json(o) for o in data["outputs"])
        return cls(**data)

    def describe(self) -> str:
        """`tensorrt 10.3.0 on NVIDIA H100` / `onnxruntime 1.22.0 (opset 18)`: for errors."""
        text = f"{self.backend} {self.version}"
        if self.opset is not None:
            text += f" (opset {self.opset})"
        if self.gpu:
            text += f" on {self.gpu}"
        return text


def digest(body: bytes | memoryview) -> str:
    """The SHA-256 of a body, hex: its identity in headers and runner caches."""
    return hashlib.sha256(body).hexdigest()


def pack(header: Header, body: bytes) -> bytes:
    """MAGIC + length + header JSON + body."""
    head = header.to_json().encode()
    return MAGIC + struct.pack("<I", len(head)) + head + body


def unpack(data: bytes | memoryview) -> tuple[Header, memoryview]:
    """The header and a view of the body; checks the magic and the length, not the hash."""
    view = memoryview(data)
    if len(view) < _PREFIX or bytes(view[: len(MAGIC)]) != MAGIC:
        raise PayloadError("not a backend-chain payload (bad magic): was the program modified?")
    (length,) = struct.unpack("<I", view[len(MAGIC) : _PREFIX])
    if len(view) < _PREFIX + length:
        raise PayloadError(f"truncated payload: header of {length} bytes, {len(view)} in all")
    try:
        header = Header.from_json(bytes(view[_PREFIX : _PREFIX + length]).decode())
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as error:
        raise PayloadError(f"payload header unreadable ({type(error).__name__}): {error}") from None
    return header, view[_PREFIX + length :]


def verify_body(header: Header, body: memoryview) -> None:
    """Raise PayloadError when the body's hash differs from the header's (corruption)."""
    actual = digest(body)
    if actual != header.sha256:
        raise PayloadError(
            f"{header.backend} payload corrupted: sha256 {actual[:12]}, "
            f"header says {header.sha256[:12]}"
        )


def to_tensor(data: bytes) -> torch.Tensor:
    """A uint8 CPU tensor holding `data` (owns a copy: bytes are immutable)."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The bytes of a uint8 payload tensor (copied to CPU if it was moved)."""
    if tensor.dtype != torch.uint8 or tensor.dim() != 1:
        raise PayloadError(
            f"payload must be a 1-d uint8 tensor, got {tensor.dtype} {tensor.dim()}-d"
        )
    return memoryview(tensor.detach().cpu().contiguous().numpy())


def version_tuple(version: str) -> tuple[int, ...]:
    """`1.22.0+cu130` -> (1, 22, 0): leading numeric parts, for comparing versions."""
    parts = []
    for piece in version.split("+")[0].split("."):
        digits = "".join(c for c in piece if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def installed_version(package: str) -> str | None:
    """The version of an importable package, or None when it is not installed."""
    if importlib.util.find_spec(package) is None:
        return None
    module = importlib.import_module(package)
    return str(getattr(module, "__version__", "unknown"))
