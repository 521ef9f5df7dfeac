"""The backend's options, validated once into a frozen value (also part of the cache key)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from backends.errors import InvalidOption
from backends.options import BadValue, Check, boolean, integer
from backends.tensorrt.partitioning import PartitionOptions


def _op_list(value: Any) -> Any:
    """An op name or a list of them (strings or torch ops)."""
    if isinstance(value, str | list | tuple | set | frozenset):
        return value
    raise BadValue("an op name or a list of op names")


def _path(value: Any) -> Any:
    if not isinstance(value, str | os.PathLike):
        raise BadValue("a path (str or os.PathLike)")
    return value


def _sizes(value: Any) -> Any:
    """Sizes at which a symbolic dim's range is cut into optimization profiles."""
    if isinstance(value, list | tuple) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    ):
        return tuple(value)
    raise BadValue("a list of sizes (ints >= 0)")


OPTIONS: dict[str, Check] = {  # name -> value check (backends.options), checked at chain()
    "min_block_size": integer(low=1, high=100_000),
    "torch_executed_ops": _op_list,
    "require_full_compilation": boolean,
    "workspace_size": integer(low=0, high=1 << 40),  # 1 TiB
    "optimization_level": integer(low=0, high=5),
    "cache_dir": _path,
    "engine_cache": boolean,
    "timing_cache": boolean,
    "profile_sizes": _sizes,
}


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/backend-chain/tensorrt`, i.e. `~/.cache/backend-chain/tensorrt`."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "backend-chain" / "tensorrt"


@dataclass(frozen=True)
class Settings:
    """Every option of the tensorrt backend, with its default."""

    min_block_size: int = 5
    torch_executed_ops: frozenset[str] = frozenset()
    require_full_compilation: bool = False
    workspace_size: int = 1 << 30
    optimization_level: int = 3
    cache_dir: Path = field(default_factory=default_cache_dir)
    engine_cache: bool = True
    timing_cache: bool = True
    # a graph with symbolic sizes: its range is cut at these sizes and at the example's
    # (one optimization profile each, plus a tail up to the range's end)
    profile_sizes: tuple[int, ...] = ()

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> Settings:
        """Validate user options; a wrong value is an InvalidOption naming what is valid."""
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise InvalidOption(f"unknown tensorrt option(s) {unknown}; valid: {list(OPTIONS)}")
        values = dict(options)
        if "torch_executed_ops" in values:
            values["torch_executed_ops"] = _op_names(values["torch_executed_ops"])
        if "profile_sizes" in values:
            values["profile_sizes"] = _sizes(values["profile_sizes"])
        if "cache_dir" in values:
            values["cache_dir"] = Path(values["cache_dir"]).expanduser()
        settings = cls(**values)
        _check_int(settings.min_block_size, "min_block_size", 1)
        _check_int(settings.workspace_size, "workspace_size", 0)
        _check_int(settings.optimization_level, "optimization_level", 0, 5)
        return settings

    def partition_options(self) -> PartitionOptions:
        return PartitionOptions(
            self.min_block_size, self.torch_executed_ops, self.require_full_compilation
        )

    def build_key(self) -> dict[str, Any]:
        """The settings that change an engine (the cache key includes exactly these)."""
        return {
            "workspace_size": self.workspace_size,
            "optimization_level": self.optimization_level,
        }

    def details(self) -> dict[str, Any]:
        """JSON-able view of the settings for the report."""
        out = asdict(self)
        out["torch_executed_ops"] = sorted(self.torch_executed_ops)
        out["cache_dir"] = str(self.cache_dir)
        return out


def _op_names(ops: Iterable[Any] | str) -> frozenset[str]:
    if isinstance(ops, str):
        ops = [ops]
    return frozenset(str(op).removeprefix("torch.ops.") for op in ops)


def _check_int(value: Any, name: str, low: int, high: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise InvalidOption(f"tensorrt option {name} must be an int >= {low}, got {value!r}")
    if high is not None and value > high:
        raise InvalidOption(f"tensorrt option {name} must be <= {high}, got {value!r}")
