"""inductor's CPU vector-ISA probe, remembered, so a warm process hits inductor's caches.

Unless `cpp.vec_isa_ok` is set, inductor probes in every process whether the C++ compiler
can build each vector ISA the CPU lists (it builds and loads a probe library in a child
Python: 0.3-0.9 s on a small CPU), and the setting is part of its FX graph cache key. For
a CPU graph whose user set neither, the chain probes once per machine (torch, compiler, CPU
flags: `package.machine`), keeps the verdict in inductor's cache folder, and
compiles with `cpp.vec_isa_ok` set to it: the first process and every later one compile
under the same key, and later ones skip the probe. The setting only says whether every ISA
the CPU lists builds, so it is set only when that is so for all of them (True) or none
(False): then inductor picks what it would have picked, and generates the same code. When
some build and some do not (an old compiler), or off x86-64 Linux, nothing is set.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from backends import cancel
from backends.common.files import atomic_write, read_bounded
from backends.errors import Unsupported, one_line
from backends.inductor.package import compiler_of, machine

log = logging.getLogger(__name__)
SETTING = "cpp.vec_isa_ok"
FILE = "chain-vec-isa.json"  # in inductor's cache folder: cleared with the cache it keys
_MAX_BYTES = 1 << 16  # a verdict per machine key; more is not ours


def _path() -> Path:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir()) / FILE


@functools.cache
def _tool(name: str) -> dict[str, str | None]:
    """A build tool's identity: its resolved path and a digest of its whole `--version`
    output (a first line can stay the same across builds of a compiler)."""
    path = shutil.which(name)
    if path is None:
        return {"path": None, "version": None}
    try:
        done = subprocess.run(
            [path, "--version"],
            capture_output=True,
            timeout=30,
            check=False,
            stdin=subprocess.DEVNULL,
        )
        said = done.stdout + done.stderr + str(done.returncode).encode()
    except (OSError, subprocess.SubprocessError) as error:
        said = type(error).__name__.encode()
    return {"path": os.path.realpath(path), "version": hashlib.sha256(said).hexdigest()[:16]}


def _toolchain(patches: Mapping[str, Any]) -> dict[str, Any]:
    """What decides whether an ISA builds besides the CPU: the compiler and the assembler
    (path, whole `--version`), and the flags the compiler is given."""
    flags = {k: os.environ.get(k) for k in ("CXXFLAGS", "CPPFLAGS", "LDFLAGS", "CXX", "AS")}
    cpp = {k: str(v) for k, v in sorted(patches.items()) if k.startswith("cpp.")}
    return {
        "cxx": _tool(compiler_of(patches)),
        "as": _tool(os.environ.get("AS", "as")),
        "flags": flags,
        "cpp": cpp,
    }


def machine_key(patches: Mapping[str, Any]) -> str:
    """What the verdict depends on: torch, the CPU's capability and flags, and the compiler
    and assembler that build the probe (their paths, whole `--version`, flags)."""
    facts = {**machine(torch.device("cpu"), patches), "toolchain": _toolchain(patches)}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:32]


Verdict = bool | None  # None: some listed ISAs build, some do not (left to inductor)


def _verdicts(path: Path) -> dict[str, Verdict]:
    """The kept verdicts; {} when the file is missing, not a regular file of this user's,
    or not a mapping of keys to verdicts (it is then probed again and rewritten)."""
    try:
        data = json.loads(read_bounded(path, _MAX_BYTES))
        if hasattr(os, "getuid") and path.stat().st_uid != os.getuid():
            return {}
    except (OSError, ValueError):  # missing, unsafe, unreadable or not JSON: probe again
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and _is_verdict(v)}


def _is_verdict(value: Any) -> bool:
    return value is None or isinstance(value, bool)  # JSON's 1 and 0 are not verdicts


def probe() -> Verdict:
    """inductor's own check (`check_build` of its probe code, what `cpp.vec_isa_ok=None`
    runs) of each vector ISA the CPU lists: True when all build, False when none does (or
    none is listed), None when some do."""
    from torch._inductor import cpu_vec_isa as isa

    flags = isa.x86_isa_checker()
    listed = [v for v in isa.supported_vec_isa_list if all(f in flags for f in str(v).split())]
    built = {bool(v.check_build(isa.VecISA._avx_code)) for v in listed}
    if not listed or built == {False}:
        return False  # inductor finds no valid ISA; `False` makes it find none without probing
    return True if built == {True} else None


def remembered(patches: Mapping[str, Any]) -> Verdict:
    """The verdict for this machine: kept, else probed now and kept (a failed write only
    means the next process probes again)."""
    path, key = _path(), machine_key(patches)
    verdicts = _verdicts(path)
    if key in verdicts:
        return verdicts[key]
    verdict = probe()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps({**verdicts, key: verdict}, sort_keys=True))
    except OSError as error:  # UnsafeFile too: nothing lost, the next process probes again
        log.warning("inductor's vector-ISA verdict not kept in %s: %s", path, error)
    return verdict


def forget(patches: Mapping[str, Any]) -> str:
    """Drop this machine's kept verdict (a compile failed under it); the file's path, for
    the reason that names it."""
    path, key = _path(), machine_key(patches)
    verdicts = _verdicts(path)
    if key in verdicts:
        del verdicts[key]
        try:
            atomic_write(path, json.dumps(verdicts, sort_keys=True))
        except OSError as error:  # the next process meets it again, and heals again
            log.warning("inductor's vector-ISA verdict not dropped from %s: %s", path, error)
    return str(path)


def compile_healed(
    compile_fn: Any, patches: Mapping[str, Any], example_inputs: Sequence[Any]
) -> tuple[Any, dict[str, Any]]:
    """`compile_fn(patches)` under the remembered verdict (`stable`), and the patches used.
    A compile that fails under a verdict this module set drops the verdict (`forget`) and
    is tried once more without it; a failure then names the verdict's file. Dynamo's
    restart and skip signals pass through untouched, the verdict kept."""
    chosen = stable(patches, example_inputs)
    if SETTING not in chosen or SETTING in patches:
        return compile_fn(chosen), chosen
    from torch._dynamo.exc import RestartAnalysis, SkipFrame

    try:
        return compile_fn(chosen), chosen
    except (Unsupported, cancel.Cancelled, RestartAnalysis, SkipFrame):
        # declined or abandoned, or dynamo's own control flow (a LayerNorm's float eps under
        # dynamic=True restarts its analysis from inductor's first compile): not the verdict
        raise
    except Exception as error:
        where = forget(patches)
        log.warning(
            "inductor failed under the vector-ISA verdict %s=%s kept in %s; dropped, "
            "compiled again without it (%s)",
            SETTING,
            chosen[SETTING],
            where,
            one_line(error)[:200],
        )
        _forget_probes()
        try:
            return compile_fn(dict(patches)), dict(patches)
        except Exception as again:
            said = (
                f"{one_line(again)} (first under the vector-ISA verdict "
                f"{SETTING}={chosen[SETTING]} kept in {where}, which was dropped)"
            )
            if isinstance(again, Unsupported):
                raise Unsupported(said) from again
            raise RuntimeError(said) from again


def _forget_probes() -> None:
    """Inductor keeps what the verdict declared for the process: the valid ISA list, and
    each ISA's own answer (AVX-512's and AMX's `__bool__` are cached per instance; seen: a
    retry on an AVX-512 CPU still built AVX-512 code). Every such cache is cleared, so the
    retry probes."""
    from torch._inductor import cpu_vec_isa

    cpu_vec_isa.valid_vec_isa_list.cache_clear()
    for cls in vars(cpu_vec_isa).values():
        if isinstance(cls, type) and issubclass(cls, cpu_vec_isa.VecISA):
            for attr in vars(cls).values():
                if callable(clear := getattr(attr, "cache_clear", None)):
                    clear()


def stable(
    patches: Mapping[str, Any], example_inputs: Sequence[Any], *, probe_now: bool = True
) -> dict[str, Any]:
    """`patches` with `cpp.vec_isa_ok` from the remembered probe, for a graph whose tensors
    are all on the CPU; unchanged where the user set it (in the options or in inductor's
    config) or the graph touches a GPU. `probe_now=False`: a verdict only if one is kept
    (the probe compiles C++, seconds on a fresh machine; a package's child probes itself)."""
    from torch._inductor import config

    on_cpu = all(x.device.type == "cpu" for x in example_inputs if isinstance(x, torch.Tensor))
    if SETTING in patches or config.cpp.vec_isa_ok is not None or not on_cpu or not _X86_LINUX:
        return dict(patches)
    if not probe_now and machine_key(patches) not in _verdicts(_path()):
        return dict(patches)
    verdict = remembered(patches)
    return dict(patches) if verdict is None else {**patches, SETTING: verdict}


# where inductor's ISA list and probe are the ones `probe` repeats
_X86_LINUX = sys.platform == "linux" and platform.machine() in ("x86_64", "AMD64")
