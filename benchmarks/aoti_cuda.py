"""Does torch load and run an AOTInductor package on CUDA, and by which route does it crash?

Each step runs in a child process with faulthandler on, so a crash is an exit status and a
traceback, not the end of the probe: build (aoti_compile_and_package), then load and run
through `torch._inductor.aoti_load_package`, through `AOTIModelPackageLoader` directly (as
backends.inductor.runner does), and through it from a private copy removed after loading.
Models: an MLP and a tiny transformers BERT, at batch 4. CUDA only: without a GPU it says so.

Seen on an H200 (torch 2.11.0+cu130, 2026-11-27, MLP): the build works; the loader with
device index 0 segfaults in its constructor, also from a private copy; aoti_load_package
was still in inductor's CPU ISA probe after 30 s (PROBE_HANG_S=30) and was stopped.
Again on 2026-11-28 (H200, same torch): the build works; every load route ends in SIGSEGV
(-11): the loader with index 0 and -1, after torch's device probe, from a private copy, and
aoti_load_package.

    python benchmarks/aoti_cuda.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_MODELS = """
import torch
def build(name):
    torch.manual_seed(0)
    if name == "mlp":
        from tests.models import MLP
        return MLP().eval().cuda(), (torch.randn(4, 32, device="cuda"),)
    from transformers import BertConfig, BertModel
    cfg = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, vocab_size=1000)
    m = BertModel(cfg).eval().cuda()
    class Wrap(torch.nn.Module):
        def __init__(self): super().__init__(); self.m = m
        def forward(self, ids): return self.m(input_ids=ids).last_hidden_state
    return Wrap().eval(), (torch.randint(0, 1000, (4, 16), device="cuda"),)
"""

_BUILD = (
    _MODELS
    + """
import sys
from torch._inductor import aoti_compile_and_package
model, args = build(sys.argv[1])
with torch.no_grad():
    expected = model(*args)
    program = torch.export.export(model, args)
    aoti_compile_and_package(program, package_path=sys.argv[2])
torch.save({"args": args, "expected": expected}, sys.argv[3])
print("built")
"""
)

_LOAD = """
import faulthandler, json, os, shutil, sys, tempfile
import torch
faulthandler.dump_traceback_later(float(os.environ.get("PROBE_HANG_S", "150")), exit=True)
route, path, io_path = sys.argv[1:4]
io = torch.load(io_path)
args, expected = io["args"], io["expected"]
if route == "aoti_load_package":
    from torch._inductor import aoti_load_package
    out = aoti_load_package(path)(*args)
else:
    if route == "private_copy":
        folder = tempfile.mkdtemp()
        copy = os.path.join(folder, "graph.pt2")
        shutil.copy(path, copy)
        path = copy
    if route == "after_device_info":  # what torch's load_pt2 does before the loader
        from torch._inductor.codecache import get_device_information
        get_device_information("cuda")
    index = -1 if route == "loader_index_-1" else 0
    loader = torch._C._aoti.AOTIModelPackageLoader(path, "model", False, 1, index)
    if route == "private_copy":
        shutil.rmtree(folder)
    out = loader.run(list(args))
    out = out[0] if isinstance(out, (list, tuple)) else out
for _ in range(3):
    torch.cuda.synchronize()
print(json.dumps({"max_error": (out.float() - expected.float()).abs().max().item()}))
"""


def _child(code: str, *argv: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONFAULTHANDLER": "1"}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=ROOT,
    )
    tail = (done.stdout + done.stderr).strip().splitlines()[-12:]
    return {"status": done.returncode, "tail": tail}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="write results.json here")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("aoti_cuda: no CUDA device here; nothing measured")
        return 0
    results: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for name in os.environ.get("PROBE_MODELS", "mlp,bert").split(","):
            pt2, io = os.path.join(folder, f"{name}.pt2"), os.path.join(folder, f"{name}.io")
            results[f"{name}/build"] = built = _child(_BUILD, name, pt2, io)
            print(name, "build", built["status"], built["tail"][-1:], flush=True)
            if built["status"] != 0:
                continue
            routes = ("loader", "loader_index_-1", "after_device_info", "private_copy",
                      "aoti_load_package")  # fmt: skip
            for route in routes:
                results[f"{name}/{route}"] = got = _child(_LOAD, route, pt2, io)
                print(name, route, got["status"], got["tail"][-1:], flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "aoti_cuda.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
