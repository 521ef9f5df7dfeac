"""The export hooks of the backend contract: a toy backend made exportable in test code only.

The toy backend compiles a graph with TorchScript; its exporter puts the saved script in a
payload and its loader loads it back. `chain.export` finds both through the registry: no
edit of `chain/` or `backends/` makes it exportable.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import fx

import chain
from backends.common import parts
from backends.common.payload import Header, PayloadError, TensorSpec, digest, pack, to_tensor
from backends.registry import registry
from chain.deploy import cache_info, clear_cache
from tests.models import build

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")
OP = torch.ops.backend_chain.run_payload.default
LOADED: list[str] = []  # sha256 of every payload the toy loader built a runner for


def toy_compile(gm: fx.GraphModule, example_inputs: list[Any], **_: Any) -> Any:
    """TorchScript of the graph (a real compiler, small enough for a test)."""
    return torch.jit.trace(gm, tuple(example_inputs), check_trace=False)


def toy_exporter(request: parts.ExportRequest) -> parts.ExportedParts | None:
    """The whole graph as one part whose body is the saved script."""
    if not request.won:
        return None
    buffer = io.BytesIO()
    torch.jit.save(request.compiled, buffer)
    body = buffer.getvalue()
    with torch.no_grad():
        outputs, _ = parts.flat_outputs(request.gm(*request.flat_inputs))
    n = len(request.flat_inputs)
    header = Header(
        backend="toy",
        version=str(torch.__version__),
        sha256=digest(body),
        input_names=tuple(f"in{i}" for i in range(n)),
        output_names=tuple(f"out{i}" for i in range(len(outputs))),
        outputs=tuple(TensorSpec.of(t) for t in outputs),
    )
    part = parts.Part(
        name=parts.WHOLE,
        header=header,
        body=body,
        input_positions=tuple(range(n)),
        returns_tuple=True,
        example_inputs=request.flat_inputs,
        expected=tuple(outputs),
    )
    return parts.ExportedParts(
        parts.as_single_call(request.gm), {parts.WHOLE: part}, "export: one toy script"
    )


def toy_loader(header: Header, body: bytes, device: torch.device) -> parts.Runner:
    """The saved script, loaded once per payload."""
    LOADED.append(header.sha256)
    script = torch.jit.load(io.BytesIO(body), map_location=device)

    def run(inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return list(script(*inputs))

    return run


@pytest.fixture
def toy() -> Iterator[None]:
    with registry.snapshot():
        registry.register("toy", exporter=toy_exporter, loader=toy_loader)(toy_compile)
        yield


def test_toy_backend_round_trips_through_save_and_load(toy: None, tmp_path: Path) -> None:
    model, args = build("mlp")
    LOADED.clear()
    result = chain.export(model, args, backend=chain.chain("toy", "eager", measure=False))
    record = result.report.graphs[0]
    assert record.winner == "toy"
    assert record.notes[-1] == "export: one toy script"
    assert [p["backend"] for p in result.parts] == ["toy"]
    assert len(LOADED) == 1  # the part was verified through the toy loader
    torch.export.save(result.program, tmp_path / "toy.pt2")
    loaded = torch.export.load(tmp_path / "toy.pt2")
    [constant] = loaded.constants.values()
    header, body = chain.deploy.unpack(constant.numpy().tobytes())
    assert header.backend == "toy" and header.sha256 == digest(body)
    assert not loaded.state_dict  # the weights travel inside the script
    clear_cache()
    before = cache_info()["built"]
    with torch.no_grad():
        actual = loaded.module()(*args)
        expected = model(*args)
    torch.testing.assert_close(actual, expected)
    assert cache_info()["built"] - before == 1 and len(LOADED) == 2


def test_backend_without_hooks_stays_pytorch(tmp_path: Path) -> None:
    model, args = build("mlp")
    with registry.snapshot():
        registry.register("plain")(toy_compile)
        result = chain.export(model, args, backend=chain.chain("plain", "eager", measure=False))
    assert result.report.graphs[0].winner == "plain"
    assert result.parts == [] and not result.program.constants
    assert "runs in PyTorch (plain won the graph)" in result.report.graphs[0].notes[-1]


def test_hooks_come_in_pairs() -> None:
    with registry.snapshot(), pytest.raises(ValueError, match="both exporter and loader"):
        registry.register("half", exporter=toy_exporter)(toy_compile)


def test_payload_of_an_unregistered_backend_names_the_loaders() -> None:
    header = Header("nobody", "1", digest(b"x"), ("a",), ("b",), (TensorSpec((2,), "float32"),))
    with pytest.raises(PayloadError, match=r"unknown backend 'nobody'.*onnxruntime"):
        OP([torch.randn(2)], to_tensor(pack(header, b"x")), "[]")
