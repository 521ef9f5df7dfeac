"""The AOTInductor compile of a saved program, in a child process of its own.

`python -m backends.inductor_build FOLDER`: reads `FOLDER/program.pt2` (written by this
user's own process, `backends.inductor_package.prepare`) and `FOLDER/configs.json`, and
writes `FOLDER/graph.pt2`. In a child, AOTInductor's process-wide config patches and
tracing never meet the user's threads, and its Python work holds another GIL.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from backends.common.files import read_bounded
from backends.errors import Unsupported

MAX_BYTES = 2 << 30  # a package without weights is megabytes
TIMEOUT_S = 3600.0  # the longest a child may compile


def compile_in_child(folder: str, configs: Mapping[str, Any]) -> bytes:
    """The package's bytes, compiled by a child Python from `folder`; Unsupported with the
    child's last line when it fails."""
    Path(folder, "configs.json").write_text(json.dumps(dict(configs)))
    root = str(Path(__file__).resolve().parent.parent)  # where `backends` is importable
    paths = [root, *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "backends.inductor_build", folder],
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise Unsupported(f"AOTInductor did not finish in {TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
        last = lines[-1][:300] if lines else f"exit status {done.returncode}"
        raise Unsupported(f"AOTInductor failed: {last}")
    return read_bounded(Path(folder, "graph.pt2"), MAX_BYTES)


def main(folder: str) -> None:
    import torch
    from torch._inductor import aoti_compile_and_package

    configs = json.loads(Path(folder, "configs.json").read_text())
    program = torch.export.load(os.path.join(folder, "program.pt2"))
    with torch.no_grad():
        aoti_compile_and_package(
            program, package_path=os.path.join(folder, "graph.pt2"), inductor_configs=configs
        )


if __name__ == "__main__":
    main(sys.argv[1])
