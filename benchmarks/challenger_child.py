"""What a challenger costs the calls that serve (issue 46): a small BERT through
chain("onnxruntime", "eager", challengers=["inductor"]), fresh store and inductor cache.

Prints the first three calls' seconds, how long the background work took to end, and the
graph's challenger notes and race. With inductor packages on (the default), inductor is
exported at the second call and compiled in a child process (`chain.select.challenge`);
with `--in-thread` (CHAIN_INDUCTOR_PACKAGE=0) it compiles in the second call, as before.

    python benchmarks/challenger_child.py [--in-thread] [--calls 3000]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in-thread", action="store_true", help="inductor compiles in call 2")
    parser.add_argument("--calls", type=int, default=3000, help="calls served after the build")
    ns = parser.parse_args()
    if ns.calls < 0:
        parser.error("--calls: expected 0 or more")
    os.environ["CHAIN_INDUCTOR_PACKAGE"] = "0" if ns.in_thread else "1"
    os.environ["CHAIN_CACHE_DIR"] = tempfile.mkdtemp(prefix="chain-bench-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="chain-bench-inductor-")
    import torch

    from chain import chain
    from chain.select import background
    from tests.models import tiny_bert

    torch.manual_seed(0)
    model, (ids,) = tiny_bert()
    model.eval()
    backend = chain("onnxruntime", "eager", challengers=["inductor"])
    fast = torch.compile(model, backend=backend)
    print(f"load at start: {os.getloadavg()[0]:.2f}")
    with torch.no_grad():
        for call in (1, 2, 3):
            start = time.perf_counter()
            fast(ids)
            print(f"call {call}: {time.perf_counter() - start:.2f} s", flush=True)
        start = time.perf_counter()
        ended = background.wait(900)
        print(f"background work ended: {ended}, after {time.perf_counter() - start:.1f} s more")
        for _ in range(ns.calls):
            torch.testing.assert_close(fast(ids), model(ids), rtol=1e-3, atol=1e-4)
    for graph in backend.report.graphs:
        print(f"graph {graph.id}: served by {graph.winner}")
        for note in graph.notes:
            if "challenger" in note or "racing" in note:
                print(f"  {note}")
        print(f"  {graph.race}")
    print(f"load at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
