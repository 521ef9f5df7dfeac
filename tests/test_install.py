"""The built wheel, installed (not editable) in a fresh venv: `chain demo` and `chain bench`
run from outside the checkout, on the venv's copy of the package."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # builds a wheel and a venv: about a minute

ROOT = Path(__file__).resolve().parents[1]
SKIP = shutil.ignore_patterns(
    ".git", "__pycache__", "*.egg-info", "build", "dist", "bench-out", ".*_cache", ".venv*"
)


def _run(cmd: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CHAIN_REPORT")}
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, f"{' '.join(cmd)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A venv (system site-packages: torch, onnxruntime from the machine) with the wheel in it."""
    base = tmp_path_factory.mktemp("install")
    source = base / "source"
    shutil.copytree(ROOT, source, ignore=SKIP)  # build a copy: no build/ in the checkout
    wheels = base / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    _run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), "."], source)
    (wheel,) = wheels.glob("backend_chain-*.whl")
    env = base / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(env)], base)
    python = env / "bin" / "python"
    # the machine's pip, run by the venv's python (it sees system site-packages): the venv
    # gets the wheel; the editable install outside the venv is left alone
    _run([str(python), "-m", "pip", "--disable-pip-version-check", "-q", "install",
          "--no-deps", "--no-build-isolation", str(wheel)], base)  # fmt: skip
    yield env


def test_the_venv_imports_its_own_copy(venv: Path, tmp_path: Path) -> None:
    probe = "import chain, chain.bench.run, backends; print(chain.__file__, backends.__file__)"
    out = _run([str(venv / "bin" / "python"), "-c", probe], tmp_path).stdout.split()
    site = str(venv.resolve())
    assert all(str(Path(p).resolve()).startswith(site) for p in out), out
    assert not any(str(ROOT) in p for p in out)


def test_chain_demo_runs_from_the_installed_package(venv: Path, tmp_path: Path) -> None:
    saved = tmp_path / "out" / "demo.json"
    # the ResNet-style model: quicker than BERT, and it needs nothing beyond the package
    argv = ["demo", "--model", "resnet", "--save", str(saved)]
    done = _run([str(venv / "bin" / "chain"), *argv], tmp_path)
    assert "device: cpu (" in done.stdout or "device: cuda (" in done.stdout
    report = json.loads(saved.read_text())
    assert len(report["graphs"]) == 2 and all(g["winner"] for g in report["graphs"])


def test_chain_bench_quick_runs_from_the_installed_package(venv: Path, tmp_path: Path) -> None:
    argv = ["bench", "--quick", "--models", "mlp", "--backends", "eager", "--chains",
            "onnxruntime,eager", "--modes", "first", "--repeats", "2", "--out", "out"]  # fmt: skip
    _run([str(venv / "bin" / "chain"), *argv], tmp_path)
    rows = json.loads((tmp_path / "out" / "results.json").read_text())["rows"]
    by_label = {r["candidate"]: r for r in rows}
    assert by_label["chain(onnxruntime,eager)[first]"]["status"] == "ok"
    # onnxruntime passes; eager runs the graph instead when ORT is measurably slower (the floor)
    assert by_label["chain(onnxruntime,eager)[first]"]["winners"] in (["onnxruntime"], ["eager"])
