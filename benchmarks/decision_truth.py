"""Do the chain's decisions hold? Selection quiet and busy, then the truth in one quiet run.

    python benchmarks/decision_truth.py [--models bert gpt2 ...] [--chains default fastest]
                                        [--out decision_truth.json]

Per model and chain, two fresh processes select (CHAIN_MEMORY=0, dynamic=False, one call):
`quiet`, and `busy` with two background threads hashing for the whole selection (a bounded
CPU load, as other jobs on the machine give; hashing releases the GIL). Then one quiet
process captures every graph again, compiles each condition's winner for it, and times eager
and every winner in one interleaved run (chain.judge.rounds.measure, 2 s a graph). Reported per
model, chain and condition: the winners, the reported speedup (the selection's summary:
eager ms / winner ms summed over graphs), the quiet speedup (the same sum from the truth
run), the worst graph's quiet speedup, and the flags (noisy graphs, eager's own speedup
not 1.0). The goal on a 2-core CPU: no winner slower than eager by more than 3% in either
condition; every reported speedup within 2x of the quiet one or flagged noisy.

Models: six small transformers models built from configs (chain.bench.zoo: bert, gpt2,
t5_encoder, vit, llama, whisper_encoder) and the benchmark suite's own (chain.bench.models:
`suite:resnet`, `suite:mlp`, ...). Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.load import fresh_python

ZOO = ("bert", "gpt2", "t5_encoder", "vit", "llama", "whisper_encoder")
SUITE = ("suite:resnet", "suite:bert", "suite:gpt", "suite:vit", "suite:mlp", "suite:graph_break")
CHAINS = {
    "default": "chain(*default_backends())",
    "fastest": "chain('onnxruntime', 'inductor', 'eager', mode='fastest')",
}
SLOWER_BY = 0.03  # a winner more than 3% slower than eager in the quiet run fails the goal
WITHIN = 2.0  # a reported speedup more than 2x off the quiet one must be flagged noisy

# one module of helpers, shared by the selection and truth processes
_COMMON = """
import hashlib, json, sys, threading, time
import torch
from chain import chain, default_backends
from chain.report.graphinfo import fingerprint

def build(name):
    if name.startswith("suite:"):
        from chain.bench.models import SUITE
        model, inputs = SUITE[name.split(":", 1)[1]].build(None, torch.device("cpu"), torch.float32)
        return model, inputs
    from chain.bench import zoo
    return zoo.build(name), zoo.inputs(name, 0)

def busy(threads, stop):
    def spin():
        data = bytes(1 << 20)
        while not stop.is_set():
            hashlib.sha256(data).digest()  # releases the GIL: CPU load, as another job gives
    workers = [threading.Thread(target=spin, daemon=True) for _ in range(threads)]
    for w in workers:
        w.start()
    return workers
"""

_SELECT = (
    _COMMON
    + """
name, condition = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
model, inputs = build(name)
stop = threading.Event()
workers = busy(2, stop) if condition == "busy" else []
if workers:
    time.sleep(2.0)  # the load is on before selection starts
backend = __CHAIN__
try:
    with torch.no_grad():
        torch.compile(model, backend=backend, dynamic=False)(*inputs)
finally:
    stop.set()
graphs = []
for g in backend.report.graphs:
    won = g.winning_attempt
    graphs.append({
        "id": g.id, "fingerprint": g.fingerprint, "winner": g.winner,
        "speedup": won.speedup if won else None, "verdict": won.verdict if won else None,
        "noisy": g.noisy, "timing": str(g.timing) if g.timing else None,
        "eager_speedups": [a.speedup for a in g.attempts
                           if a.backend == "eager" and a.speedup is not None],
    })
print(json.dumps({"summary": backend.report.summary(), "graphs": graphs}))
"""
)

_TRUTH = (
    _COMMON
    + """
from backends.registry import registry
from chain.judge.rounds import measure

plan = json.loads(sys.argv[1])  # {model: {condition: [winner per graph]}}
out = {}
for name, conditions in plan.items():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, inputs = build(name)
    graphs = []

    def capture(gm, example_inputs):
        i, fns = len(graphs), {"eager": gm.forward}
        for condition, winners in conditions.items():
            winner = winners[i] if i < len(winners) else None
            if winner and winner != "eager" and winner not in fns:
                fns[winner] = registry.lookup(winner)(gm, list(example_inputs))
        graphs.append((fingerprint(gm, example_inputs), list(example_inputs), fns))
        return gm.forward

    with torch.no_grad():
        torch.compile(model, backend=capture, dynamic=False)(*inputs)
    rows = []
    for fp, example, fns in graphs:
        timings = measure(fns, example, baseline="eager", budget_s=2.0, min_rounds=30)
        rows.append({"fingerprint": fp,
                     "ms": {k: t.median_ms for k, t in timings.items()},
                     "noisy": list(timings["eager"].evidence.noisy)})
    out[name] = rows
print(json.dumps(out))
"""
)


def _python(code: str, *args: str, timeout_s: float = 1800) -> Any:
    """Run `code` in a fresh quiet process (memory off); its last stdout line as JSON."""
    return fresh_python(code, args, {"CHAIN_MEMORY": "0"}, timeout_s)


def select(model: str, chain: str, condition: str) -> dict[str, Any]:
    """One selection in a fresh process: the report's summary and each graph's winner."""
    return _python(_SELECT.replace("__CHAIN__", CHAINS[chain]), model, condition)


def truth(plan: dict[str, dict[str, list[str | None]]]) -> dict[str, Any]:
    """Every model's graphs, eager and each winner timed together in one quiet process."""
    return _python(_TRUTH, json.dumps(plan))


def quiet_speedup(rows: list[dict[str, Any]], winners: list[str | None]) -> tuple[float, float]:
    """The quiet run's speedup of these winners: summed over graphs, and the worst graph's."""
    eager = total = 0.0
    worst = float("inf")
    for row, winner in zip(rows, winners, strict=False):
        ms = row["ms"]
        mine = ms.get(winner or "eager", ms["eager"])
        eager += ms["eager"]
        total += mine
        worst = min(worst, ms["eager"] / mine)
    return (eager / total if total else float("nan")), worst


def verdicts(
    selected: dict[str, Any], rows: list[dict[str, Any]], quiet: float, worst: float
) -> list[str]:
    """What fails the goal: a winner slower than eager by over 3%, a reported figure off by
    more than 2x and not flagged, eager's own speedup not 1.0 (and graphs that differ
    between the selection and the truth run, which make the comparison void)."""
    out = []
    if [g["fingerprint"] for g in selected["graphs"]] != [r["fingerprint"] for r in rows]:
        out.append("the truth run's graphs differ from the selection's")
    noisy = sum(g["noisy"] for g in selected["graphs"])
    reported = selected["summary"].get("speedup")
    if worst < 1 - SLOWER_BY:
        out.append(f"a winner at {worst:.2f}x eager")
    if reported and quiet and not noisy and not 1 / WITHIN <= reported / quiet <= WITHIN:
        out.append(f"reported {reported:.2f}x vs quiet {quiet:.2f}x, unflagged")
    eager = [s for g in selected["graphs"] for s in g["eager_speedups"]]
    if any(s != 1.0 for s in eager):
        out.append(f"eager's own speedup {sorted(set(eager))}")
    return out


def _winners(selected: dict[str, Any]) -> str:
    names = [g["winner"] or "none" for g in selected["graphs"]]
    return ", ".join(f"{n} x{names.count(n)}" for n in dict.fromkeys(names))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=[*ZOO, *SUITE])
    parser.add_argument("--chains", nargs="+", default=list(CHAINS), choices=list(CHAINS))
    parser.add_argument("--conditions", nargs="+", default=["quiet", "busy"])
    parser.add_argument("--out", type=Path, default=None, help="results as JSON")
    args = parser.parse_args()

    selections: dict[tuple[str, str, str], dict[str, Any]] = {}
    for model in args.models:
        for chain in args.chains:
            for condition in args.conditions:
                print(f"selecting: {model}, {chain} chain, {condition}", file=sys.stderr)
                selections[model, chain, condition] = select(model, chain, condition)
    plan: dict[str, dict[str, list[str | None]]] = {}
    for (model, chain, condition), selected in selections.items():
        plan.setdefault(model, {})[f"{chain}/{condition}"] = [
            g["winner"] for g in selected["graphs"]
        ]
    print("timing every winner against eager in one quiet process", file=sys.stderr)
    timed = truth(plan)

    rows = []
    for (model, chain, condition), selected in selections.items():
        winners = plan[model][f"{chain}/{condition}"]
        quiet, worst = quiet_speedup(timed[model], winners)
        noisy = sum(g["noisy"] for g in selected["graphs"])
        rows.append({
            "model": model, "chain": chain, "condition": condition,
            "winners": _winners(selected), "reported": selected["summary"].get("speedup"),
            "quiet": quiet, "worst": worst, "noisy": noisy,
            "fails": verdicts(selected, timed[model], quiet, worst), "graphs": selected["graphs"],
        })  # fmt: skip
    print("| model | chain | condition | winners | reported | quiet | worst graph | flag | goal |")
    print("|---|---|---|---|---:|---:|---:|---|---|")
    for r in rows:
        reported = f"{r['reported']:.2f}x" if r["reported"] else "-"
        flag = f"noisy ({r['noisy']})" if r["noisy"] else ""
        goal = "; ".join(r["fails"]) or "ok"
        print(
            f"| {r['model']} | {r['chain']} | {r['condition']} | {r['winners']} | {reported} | "
            f"{r['quiet']:.2f}x | {r['worst']:.2f}x | {flag} | {goal} |"
        )
    loud = sorted({why for rows_ in timed.values() for row in rows_ for why in row["noisy"]})
    if loud:
        print(f"\nthe truth run itself was noisy (its figures may not hold): {'; '.join(loud)}")
    if args.out is not None:
        args.out.write_text(json.dumps({"rows": rows, "truth": timed}, indent=2))


if __name__ == "__main__":
    main()
