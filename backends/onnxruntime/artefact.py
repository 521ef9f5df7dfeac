"""An exported graph as an artefact: the ONNX model bytes and how the graph's inputs feed
it, so that a new process builds its session without exporting again (`reuse`).

Bytes: a first line `onnxruntime-artefact <format> <header length>`, a JSON header (the
`OnnxGraph` fields but the model), then the model. Integrity and trust are the store's
business (the chain digests and signs what it stores); this module only checks the shape.
"""

from __future__ import annotations

import json
from typing import Any

from backends.common.onnx_export import OnnxGraph
from backends.errors import Unsupported
from backends.registry import Artefact

FORMAT = 1
MAGIC = b"onnxruntime-artefact"


def to_artefact(graph: OnnxGraph) -> Artefact:
    """The graph as an artefact; it reads the frozen weights and inlined module scalars."""
    header = {
        "input_names": list(graph.input_names),
        "output_names": list(graph.output_names),
        "input_positions": list(graph.input_positions),
        "frozen": list(graph.frozen),
        "derived": list(graph.derived),
        "scalars": {str(k): v for k, v in graph.scalars.items()},
        "dynamic_dims": {str(k): list(v) for k, v in graph.dynamic_dims.items()},
        "opset": graph.opset,
        "num_initializers": graph.num_initializers,
        "decomposed": list(graph.decomposed),
        "mutated": list(graph.mutated),
    }
    text = json.dumps(header, sort_keys=True).encode()
    first = MAGIC + f" {FORMAT} {len(text)}\n".encode()
    reads = tuple(sorted({*graph.frozen, *graph.scalars}))
    return Artefact(first + text + graph.model, reads)


def from_artefact(data: bytes) -> OnnxGraph:
    """The exported graph in `data`; Unsupported when it is not one this version reads."""
    first, _, rest = data.partition(b"\n")
    fields = first.split(b" ")
    if len(fields) != 3 or fields[0] != MAGIC or fields[1] != str(FORMAT).encode():
        raise Unsupported(f"not an onnxruntime artefact of format {FORMAT}: {first[:60]!r}")
    size = int(fields[2])
    try:
        header: dict[str, Any] = json.loads(rest[:size])
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise Unsupported(f"onnxruntime artefact header unreadable: {error}") from None
    return OnnxGraph(
        model=rest[size:],
        input_names=tuple(header["input_names"]),
        output_names=tuple(header["output_names"]),
        input_positions=tuple(header["input_positions"]),
        frozen=tuple(header["frozen"]),
        derived=tuple(header["derived"]),
        scalars={int(k): v for k, v in header["scalars"].items()},
        dynamic_dims={int(k): tuple(v) for k, v in header["dynamic_dims"].items()},
        opset=int(header["opset"]),
        num_initializers=int(header["num_initializers"]),
        decomposed=tuple(header["decomposed"]),
        mutated=tuple(header["mutated"]),
    )
