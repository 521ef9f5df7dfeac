"""The issue's repro of `compile_timeout_s`, in fresh processes: does abandoning a slow ONNX
export ever crash the process or leave its streams redirected?

Each process compiles a tiny BertModel with chain("onnxruntime", "eager",
compile_timeout_s=0.5) at three lengths, then keeps dynamo compiling other models for 2 s
while the abandoned exports run. Printed per run: exit code, whether sys.stdout/sys.stderr
were still redirected, and each attempt's reason (with the wait for a trace in flight).

    python benchmarks/abandoned_exports.py [--runs 10] [--parallel 2]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _script() -> str:
    """The repro of tests/test_timeouts.py, plus a line per attempt."""
    sys.path.insert(0, str(ROOT))
    from tests.test_timeouts import REPRO as code

    return code + (
        "for g in backend.report.graphs:\n"
        "    for a in g.attempts:\n"
        "        print('attempt', g.id, a.backend, a.status.value, a.reason, file=sys.__stdout__)\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--parallel", type=int, default=2)
    args = parser.parse_args()
    code = _script()
    crashed = redirected = 0
    done = 0
    while done < args.runs:
        batch = min(args.parallel, args.runs - done)
        start = time.perf_counter()
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", code],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(batch)
        ]
        for proc in procs:
            out, err = proc.communicate()
            done += 1
            still = "redirected False" not in out
            crashed += proc.returncode != 0
            redirected += proc.returncode == 0 and still
            print(f"run {done}: rc {proc.returncode}, redirected {still}")
            if proc.returncode:
                print(textwrap.indent(err[-6000:], "    | "))
            for line in out.splitlines():
                if line.startswith("attempt"):
                    print("   ", line[len("attempt ") :])
        print(f"  ({time.perf_counter() - start:.0f} s for {batch} at once)")
    print(f"{args.runs} runs: {crashed} crashed, {redirected} left streams redirected")


if __name__ == "__main__":
    main()
