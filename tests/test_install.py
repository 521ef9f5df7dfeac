"""The built wheel, installed (not editable) in a fresh venv: `chain demo` and `chain bench`
run from outside the checkout, on the venv's copy of the package."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from importlib import metadata
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # builds a wheel and a venv: about a minute

ROOT = Path(__file__).resolve().parents[1]
SKIP = shutil.ignore_patterns(
    ".git", "__pycache__", "*.egg-info", "build", "dist", "bench-out", ".*_cache", ".venv*"
)


def _run(
    cmd: list[str], cwd: Path, timeout: int = 300, pythonpath: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    """Run `cmd` without the checkout on its path (PYTHONPATH is `pythonpath` or nothing)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CHAIN_REPORT")}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, f"{' '.join(cmd)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _outside_checkout() -> list[str]:
    """Where this interpreter finds torch and the rest: its import path less the checkout.

    Whether pytest runs in a venv, in the system interpreter or on a `pip install --target`
    folder (PYTHONPATH), the build and the installed package must see the same dependencies.
    """
    keep = []
    for entry in sys.path:
        path = Path(entry or ".").resolve()
        # a venv inside the checkout (CI's .venv-ci) is a dependency folder: keep it; the
        # checkout itself and its source folders are not
        in_source = (path == ROOT or ROOT in path.parents) and "site-packages" not in path.parts
        if path.is_dir() and not in_source:
            keep.append(str(path))
    return list(dict.fromkeys(keep))


def _borrowed_paths(venv_python: Path) -> list[str]:
    """This interpreter's dependency folders that the new venv lacks, for its .pth file.

    Plain path entries: the .pth files in those folders (an editable install of this
    checkout among them) are not run in the venv.
    """
    probe = "import sys; print('\\n'.join(sys.path))"
    own = _run([str(venv_python), "-c", probe], venv_python.parent).stdout.split("\n")
    own_resolved = {str(Path(p).resolve()) for p in own if p}
    return [p for p in _outside_checkout() if p not in own_resolved]


def _no_build_isolation() -> list[str]:
    """`--no-build-isolation` where this interpreter can build the wheel itself (quick,
    offline: setuptools with its own bdist_wheel, or the `wheel` package); else pip fetches
    setuptools into an isolated build environment."""
    try:
        setuptools = tuple(int(x) for x in metadata.version("setuptools").split(".")[:2])
    except (metadata.PackageNotFoundError, ValueError):
        return []
    if setuptools >= (70, 1) or importlib.util.find_spec("wheel") is not None:
        return ["--no-build-isolation"]
    return []


def _site_packages(venv_python: Path) -> Path:
    probe = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(_run([str(venv_python), "-c", probe], venv_python.parent).stdout.strip())


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A bare venv that borrows this interpreter's dependencies (torch, onnxruntime) through a
    .pth file, with the built wheel installed in it (not editable)."""
    base = tmp_path_factory.mktemp("install")
    source = base / "source"
    shutil.copytree(ROOT, source, ignore=SKIP)  # build a copy: no build/ in the checkout
    wheels = base / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    build = [*pip, "wheel", "--no-deps", *_no_build_isolation(), "-w", str(wheels), "."]
    _run(build, source, pythonpath=_outside_checkout())
    (wheel,) = wheels.glob("backend_chain-*.whl")
    env = base / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(env)], base)
    python = env / "bin" / "python"
    borrowed = _borrowed_paths(python)
    (_site_packages(python) / "borrowed-from-pytest.pth").write_text("\n".join(borrowed) + "\n")
    # this interpreter's pip, run by the venv's python (it sees the borrowed paths): the
    # wheel goes into the venv, even where a copy of the package sits among the borrowed
    # folders (--ignore-installed); the install outside the venv is left alone
    _run([str(python), "-m", "pip", "--disable-pip-version-check", "-q", "install",
          "--no-deps", "--ignore-installed", str(wheel)], base)  # fmt: skip
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
