"""Engine cache keys and the on-disk cache: stable keys, atomic writes, corrupt entries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import fx

from backends.common.payload import TensorSpec
from backends.tensorrt.conversion.cache import EngineCache, cache_key
from backends.tensorrt.conversion.profiles import Profile
from backends.tensorrt.settings import Settings
from tests.trt.helpers import aten_graph

SETTINGS = Settings().build_key()


def _block(weight: torch.Tensor) -> fx.GraphModule:
    gm = aten_graph(lambda x: x.relu(), torch.randn(2, 3))
    gm.register_buffer("_const_w", weight, persistent=False)
    return gm


def _key(block: fx.GraphModule, shape: tuple[int, ...] = (2, 3), **kw: object) -> str:
    args = {"settings": SETTINGS, "trt_version": "10.9.0", "device_name": "NVIDIA H100", **kw}
    return cache_key(block, [TensorSpec(shape, "float32")], **args)  # type: ignore[arg-type]


def test_same_graph_same_key() -> None:
    w = torch.arange(6.0)
    assert _key(_block(w)) == _key(_block(w.clone()))
    assert len(_key(_block(w))) == 64


@pytest.mark.parametrize(
    "change",
    [
        {"shape": (4, 3)},
        {"settings": {**SETTINGS, "optimization_level": 5}},
        {"settings": {**SETTINGS, "workspace_size": 1 << 20}},
        {"trt_version": "11.0.0"},
        {"device_name": "NVIDIA A10G"},
        {"toolchain": {"torch": "2.99.0", "onnx": None}},
    ],
)
def test_different_inputs_settings_version_or_gpu_change_the_key(change: dict) -> None:
    block = _block(torch.arange(6.0))
    assert _key(block, **change) != _key(block)


def test_the_optimization_profiles_are_in_the_key() -> None:
    """An engine with profiles (a symbolic graph's block) never hits one fixed at the example
    shape, nor one whose ranges were cut elsewhere."""
    block = _block(torch.arange(6.0))
    cut_at_8 = [
        Profile({"x": ((2, 2), (2, 8), (2, 8))}),
        Profile({"x": ((2, 9), (2, 9), (2, 64))}),
    ]
    cut_at_16 = [
        Profile({"x": ((2, 2), (2, 16), (2, 16))}),
        Profile({"x": ((2, 17), (2, 17), (2, 64))}),
    ]
    keys = {_key(block), _key(block, profiles=cut_at_8), _key(block, profiles=cut_at_16)}
    assert len(keys) == 3
    assert _key(block, profiles=cut_at_8) == _key(block, profiles=list(cut_at_8))


def test_the_installed_toolchain_is_in_the_key() -> None:
    """By default the key holds the installed torch, exporter and backend-chain versions:
    an upgrade of any of them misses instead of loading an engine built by the old one."""
    from backends.tensorrt.conversion.cache import toolchain_versions

    found = toolchain_versions()
    assert found["torch"] == torch.__version__
    assert set(found) == {"torch", "onnx", "onnxscript", "backend-chain"}
    block = _block(torch.arange(6.0))
    assert _key(block) == _key(block, toolchain=found)
    for package in found:
        assert _key(block, toolchain={**found, package: "0.0.0"}) != _key(block), package


def test_different_weights_or_structure_change_the_key() -> None:
    w = torch.arange(6.0)
    assert _key(_block(w)) != _key(_block(w + 1))
    other = aten_graph(lambda x: x.sigmoid(), torch.randn(2, 3))
    other.register_buffer("_const_w", w, persistent=False)
    assert _key(other) != _key(_block(w))


def test_store_then_load_round_trips(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path)
    cache.store("k" * 64, b"engine-bytes", {"inputs": ["x"], "outputs": ["y"]})
    hit = cache.load("k" * 64)
    assert hit is not None and hit.engine == b"engine-bytes"
    assert hit.meta["inputs"] == ["x"] and hit.meta["outputs"] == ["y"]
    assert cache.load("m" * 64) is None
    leftovers = [p.name for p in (tmp_path / "engines").iterdir() if p.suffix == ".tmp"]
    assert leftovers == []


@pytest.mark.parametrize("damage", ["meta_not_json", "engine_truncated", "meta_wrong_format"])
def test_corrupt_entry_warns_and_misses(tmp_path: Path, damage: str) -> None:
    cache = EngineCache(tmp_path)
    cache.store("a" * 64, b"engine-bytes", {"inputs": ["x"], "outputs": ["y"]})
    engine_path = tmp_path / "engines" / ("a" * 64 + ".engine")
    meta_path = engine_path.with_suffix(".json")
    if damage == "meta_not_json":
        meta_path.write_text("{not json")
    elif damage == "engine_truncated":
        engine_path.write_bytes(b"engine")
    else:
        meta_path.write_text(json.dumps({"format": 99}))
    with pytest.warns(RuntimeWarning, match="ignoring corrupt TensorRT engine cache entry"):
        assert cache.load("a" * 64) is None


def test_timing_cache_missing_is_empty_and_writes_atomically(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path / "sub")
    assert cache.read_timing_cache() == b""
    cache.write_timing_cache(b"tactics")
    assert cache.read_timing_cache() == b"tactics"
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["timing.cache"]


def test_default_cache_dir_and_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert Settings().cache_dir == Path.home() / ".cache" / "backend-chain" / "tensorrt"
    assert Settings.from_options({"cache_dir": str(tmp_path)}).cache_dir == tmp_path
