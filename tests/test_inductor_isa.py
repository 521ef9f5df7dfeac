"""inductor's vector-ISA probe, remembered (backends.inductor.isa): one verdict per machine,
kept in inductor's cache folder; a later process compiles under the same FX cache key and
skips the probe; the user's own setting always wins; a damaged or planted file is probed
over, never trusted."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from backends.inductor import isa as inductor_isa
from tests.helpers import fresh_process

CPU = [torch.randn(2, 4)]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """inductor's cache folder for this test, and a probe that counts its runs."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    return tmp_path


def _counting(monkeypatch: pytest.MonkeyPatch, verdict: bool | None = True) -> list[int]:
    runs: list[int] = []

    def probe() -> bool | None:
        runs.append(1)
        return verdict

    monkeypatch.setattr(inductor_isa, "probe", probe)
    return runs


def test_the_first_compile_probes_and_keeps_the_verdict(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = _counting(monkeypatch, verdict=False)
    assert inductor_isa.stable({"max_autotune": False}, CPU) == {
        "max_autotune": False,
        "cpp.vec_isa_ok": False,
    }
    kept = json.loads((cache / inductor_isa.FILE).read_text())
    assert kept == {inductor_isa.machine_key({}): False}
    assert inductor_isa.stable({}, CPU) == {"cpp.vec_isa_ok": False}
    assert runs == [1]  # the second asked the file


@pytest.mark.parametrize(
    ("builds", "verdict"),
    [({"avx512", "avx2"}, True), (set(), False), ({"avx2"}, None)],
    ids=["all-build", "none-build", "some-build"],
)
def test_the_verdict_is_set_only_when_it_changes_nothing(
    monkeypatch: pytest.MonkeyPatch, builds: set[str], verdict: bool | None
) -> None:
    """True only when every ISA the CPU lists builds (then inductor picks what it would
    have), False when none does; an old compiler that builds some is left to inductor."""
    from torch._inductor import cpu_vec_isa as isa

    monkeypatch.setattr(isa, "x86_isa_checker", lambda: ["avx2", "avx512"])
    monkeypatch.setattr(isa.VecISA, "check_build", lambda self, code: str(self) in builds)
    assert inductor_isa.probe() is verdict


def test_an_undecided_verdict_leaves_the_setting_alone(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = _counting(monkeypatch, verdict=None)
    assert inductor_isa.stable({}, CPU) == {}
    assert inductor_isa.stable({}, CPU) == {}
    assert runs == [1]  # kept as undecided: not probed again
    assert json.loads((cache / inductor_isa.FILE).read_text()) == {
        inductor_isa.machine_key({}): None
    }


def test_the_probe_agrees_with_inductor_here() -> None:
    """On this machine: True means inductor's own probing finds every listed ISA valid."""
    from torch._inductor import cpu_vec_isa as isa

    verdict = inductor_isa.probe()
    flags = isa.x86_isa_checker()
    listed = [v for v in isa.supported_vec_isa_list if all(f in flags for f in str(v).split())]
    if verdict is True:
        assert listed and all(v.check_build(isa.VecISA._avx_code) for v in listed)
    elif verdict is False:
        assert not any(v.check_build(isa.VecISA._avx_code) for v in listed)


def test_another_compiler_is_probed_again(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _counting(monkeypatch)
    inductor_isa.stable({}, CPU)
    inductor_isa.stable({"cpp.cxx": "clang++"}, CPU)  # another compiler: its own verdict
    assert runs == [1, 1]
    assert len(json.loads((cache / inductor_isa.FILE).read_text())) == 2


@pytest.mark.parametrize(
    "patches", [{"cpp.vec_isa_ok": False}, {"cpp.vec_isa_ok": None}], ids=["false", "none"]
)
def test_the_users_setting_wins(
    cache: Path, monkeypatch: pytest.MonkeyPatch, patches: dict[str, object]
) -> None:
    runs = _counting(monkeypatch)
    assert inductor_isa.stable(patches, CPU) == patches
    from torch._inductor import config

    with config.patch({"cpp.vec_isa_ok": False}):  # set in inductor's config instead
        assert inductor_isa.stable({}, CPU) == {}
    assert runs == [] and not (cache / inductor_isa.FILE).exists()


def test_a_graph_off_the_cpu_is_left_alone(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _counting(monkeypatch)
    assert inductor_isa.stable({}, [torch.empty(2, device="meta"), 3]) == {}
    assert runs == []


@pytest.mark.parametrize(
    "content",
    ["not json", "[true]", '{"KEY": "yes"}', '{"KEY": 1}'],
    ids=["garbage", "list", "string", "number"],
)
def test_a_damaged_file_is_probed_over(
    cache: Path, monkeypatch: pytest.MonkeyPatch, content: str
) -> None:
    path = cache / inductor_isa.FILE
    path.write_text(content.replace("KEY", inductor_isa.machine_key({})))
    runs = _counting(monkeypatch, verdict=True)
    assert inductor_isa.stable({}, CPU) == {"cpp.vec_isa_ok": True}
    assert runs == [1]
    assert json.loads(path.read_text()) == {inductor_isa.machine_key({}): True}


def test_a_planted_link_is_neither_read_nor_followed(
    cache: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A link in the cache folder to a file saying "true": not read, not written through."""
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "verdicts.json"
    elsewhere.write_text(json.dumps({inductor_isa.machine_key({}): True}))
    (cache / inductor_isa.FILE).symlink_to(elsewhere)
    runs = _counting(monkeypatch, verdict=False)
    assert inductor_isa.stable({}, CPU) == {"cpp.vec_isa_ok": False}
    assert runs == [1]
    assert json.loads(elsewhere.read_text()) == {inductor_isa.machine_key({}): True}


# Compiles a small MLP with inductor through the chain (no package, no decision store) and
# says whether inductor's FX graph cache hit and whether the ISA probe built anything.
_CHILD = """
import json
import torch
from torch._dynamo.utils import counters
from torch._inductor import cpu_vec_isa
from chain import chain
from tests.models import MLP

builds = []  # the ISA probes built for the base check (torch's extra-feature checks, bf16
check_build = cpu_vec_isa.VecISA.check_build  # and AMX, run whatever the setting says)
def counted(self, code):
    if code == cpu_vec_isa.VecISA._avx_code:
        builds.append(str(self))
    return check_build(self, code)
cpu_vec_isa.VecISA.check_build = counted

torch.manual_seed(0)
model = MLP().eval()
backend = chain("inductor", memory=False, verify=False, measure=False)
x = torch.randn(4, 32)
with torch.inference_mode():
    error = (torch.compile(model, backend=backend)(x) - model(x)).abs().max().item()
print(json.dumps({
    "hits": counters["inductor"]["fxgraph_cache_hit"], "builds": builds, "error": error,
    "winner": backend.report.graphs[0].winner,
}))
"""


@pytest.mark.slow
def test_a_second_process_hits_the_cache_without_probing(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
        "CHAIN_INDUCTOR_PACKAGE": "0",
    }
    cold = fresh_process(_CHILD, env=env)
    warm = fresh_process(_CHILD, env=env)
    assert cold["winner"] == warm["winner"] == "inductor"
    if not cold["builds"]:
        pytest.skip("inductor lists no vector ISA on this CPU: there is no probe to skip")
    assert cold["hits"] == 0, cold  # the one probe, in the first process
    assert warm["hits"] >= 1 and warm["builds"] == [], warm
    assert max(cold["error"], warm["error"]) < 1e-5


# -- a stale or planted verdict heals (issue 44, item 5) ----------------------------------

# A compiler that cannot build the picked ISA's code (as an old one cannot build what the CPU
# lists): g++ behind a script that refuses its first flag (-mavx2, -mavx512f), or, as
# `broken`, every compile.
_COMPILER = """#!/bin/sh
for arg in "$@"; do
  case "$arg" in
    --version) exec g++ --version;;
    {refused}) echo "no such ISA here" >&2; exit 1;;
  esac
done
exec g++ "$@"
"""

_HEAL = """
import json, sys
import torch
from torch import fx
from backends.inductor import isa as inductor_isa
from backends.inductor import inductor

patches = {"cpp.cxx": sys.argv[1]}
path = inductor_isa._path()
path.parent.mkdir(parents=True, exist_ok=True)
key = inductor_isa.machine_key(patches)
path.write_text(json.dumps({key: True}))  # planted (or stale): "every listed ISA builds"
gm = fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()))
x = torch.randn(4, 8)
want = gm(x)
try:
    out = inductor(gm, [x], **patches)(x)
    error = None
    right = bool(torch.allclose(out[0] if isinstance(out, (list, tuple)) else out, want))
except Exception as failure:
    error, right = str(failure), False
print(json.dumps({"error": error, "right": right, "kept": json.loads(path.read_text()).get(key)}))
"""


def _compiler(folder: Path, refused: str) -> str:
    path = folder / f"cxx-{len(refused)}"
    path.write_text(_COMPILER.replace("{refused}", refused))
    path.chmod(0o755)
    return str(path)


def _heal(tmp_path: Path, refused: str) -> dict[str, object]:
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
    }
    return fresh_process(_HEAL, _compiler(tmp_path, refused), env=env)


@pytest.mark.skipif(not inductor_isa._X86_LINUX, reason="the verdict is kept on x86-64 Linux")
@pytest.mark.slow
def test_a_planted_true_verdict_heals(tmp_path: Path) -> None:
    from torch._inductor import cpu_vec_isa as isa

    picked = isa.pick_vec_isa()
    if not picked or not picked.build_arch_flags().strip():
        pytest.skip("inductor picks no vector ISA here: the planted verdict changes nothing")
    # the compiler refuses the ISA inductor picks on this CPU (AVX2, AVX-512...): only the
    # planted verdict lets it try that one without a probe
    got = _heal(tmp_path, picked.build_arch_flags().split()[0] + "*")
    assert got["error"] is None and got["right"], got  # compiled again without the verdict
    assert got["kept"] is not True, got  # and the verdict dropped from the file


@pytest.mark.skipif(not inductor_isa._X86_LINUX, reason="the verdict is kept on x86-64 Linux")
@pytest.mark.slow
def test_a_failure_under_the_verdict_names_its_file(tmp_path: Path) -> None:
    got = _heal(tmp_path, "*.cpp")  # nothing compiles: the retry fails too
    assert got["error"] is not None and inductor_isa.FILE in str(got["error"]), got
    assert "dropped" in str(got["error"]) and got["kept"] is not True


def test_the_key_sees_the_whole_compiler_and_the_assembler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # two builds of "the same" compiler: one first line, other details after it
    keys = set()
    for build in ("build 1", "build 2"):
        path = tmp_path / build.replace(" ", "")
        path.write_text(f'#!/bin/sh\necho "g++ (GCC) 13.2.0"\necho "{build}"\n')
        path.chmod(0o755)
        keys.add(inductor_isa.machine_key({"cpp.cxx": str(path)}))
    assert len(keys) == 2
    monkeypatch.setenv("AS", str(tmp_path / "build1"))  # another assembler
    keys.add(inductor_isa.machine_key({"cpp.cxx": str(tmp_path / "build1")}))
    monkeypatch.setenv("CXXFLAGS", "-O0")  # other flags
    keys.add(inductor_isa.machine_key({"cpp.cxx": str(tmp_path / "build1")}))
    assert len(keys) == 4
