"""Registration by discovery: the backends folder is the list, imported in name order."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import backends
from backends.registry import import_submodules, registry


def test_the_folder_registers_every_builtin_backend_and_variant() -> None:
    assert {"cudagraphs", "eager", "inductor", "onnxruntime", "tensorrt"} <= set(registry.names())
    graphed = {n for n in registry.names() if registry.lookup(n).graphed is not None}
    assert graphed == {"eager", "inductor", "onnxruntime", "tensorrt"}


def test_discovery_imports_no_compiler_library() -> None:
    """Registering is cheap: onnxruntime, onnx and tensorrt load only when a backend runs."""
    libraries = "{'onnxruntime', 'onnx', 'tensorrt'}"
    code = f"import backends, sys; print(sorted({libraries} & set(sys.modules)))"
    root = Path(backends.__file__).parent.parent
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_new_file_in_a_package_is_a_new_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "toy_backends"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in ("zeta", "alpha", "_private"):
        (package / f"{name}.py").write_text(
            "from backends.registry import register_backend\n"
            f"@register_backend('toy_{name}')\n"
            "def compile(gm, example_inputs):\n"
            "    return gm.forward\n"
        )
    monkeypatch.syspath_prepend(str(tmp_path))
    with registry.snapshot():
        assert import_submodules("toy_backends") == ["alpha", "zeta"]
        assert "toy_alpha" in registry and "toy_zeta" in registry
        assert "toy__private" not in registry
    assert "toy_alpha" not in registry
    for name in [m for m in sys.modules if m.startswith("toy_backends")]:
        monkeypatch.delitem(sys.modules, name)
