"""inductor's CPU vector-ISA probe, remembered, so a warm process hits inductor's caches.

Unless `cpp.vec_isa_ok` is set, inductor probes in every process whether the C++ compiler
can build each vector ISA the CPU lists (it builds and loads a probe library in a child
Python: 0.3-0.9 s on a small CPU), and the setting is part of its FX graph cache key. For
a CPU graph whose user set neither, the chain probes once per machine (torch, compiler, CPU
flags: `inductor_package.machine`), keeps the verdict in inductor's cache folder, and
compiles with `cpp.vec_isa_ok` set to it: the first process and every later one compile
under the same key, and later ones skip the probe. The verdict is what inductor would have
found, so the generated code is the same.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from backends.common.files import atomic_write, read_bounded
from backends.inductor_package import machine

log = logging.getLogger(__name__)
SETTING = "cpp.vec_isa_ok"
FILE = "chain-vec-isa.json"  # in inductor's cache folder: cleared with the cache it keys
_MAX_BYTES = 1 << 16  # a verdict per machine key; more is not ours


def _path() -> Path:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir()) / FILE


def machine_key(patches: Mapping[str, Any]) -> str:
    """What the verdict depends on (torch, the compiler, the CPU's capability and flags)."""
    facts = machine(torch.device("cpu"), patches)
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:32]


def _verdicts(path: Path) -> dict[str, bool]:
    """The kept verdicts; {} when the file is missing, not a regular file of this user's,
    or not a mapping of keys to booleans (it is then probed again and rewritten)."""
    try:
        data = json.loads(read_bounded(path, _MAX_BYTES))
        if hasattr(os, "getuid") and path.stat().st_uid != os.getuid():
            return {}
    except (OSError, ValueError):  # missing, unsafe, unreadable or not JSON: probe again
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, bool)}


def probe() -> bool:
    """inductor's own verdict: whether the vector ISA it would pick builds here."""
    from torch._inductor import config
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    with config.patch({SETTING: None}):
        return bool(pick_vec_isa())


def remembered(patches: Mapping[str, Any]) -> bool:
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


def stable(patches: Mapping[str, Any], example_inputs: Sequence[Any]) -> dict[str, Any]:
    """`patches` with `cpp.vec_isa_ok` from the remembered probe, for a graph whose tensors
    are all on the CPU; unchanged where the user set it (in the options or in inductor's
    config) or the graph touches a GPU."""
    from torch._inductor import config

    on_cpu = all(x.device.type == "cpu" for x in example_inputs if isinstance(x, torch.Tensor))
    if SETTING in patches or config.cpp.vec_isa_ok is not None or not on_cpu:
        return dict(patches)
    return {**patches, SETTING: remembered(patches)}
