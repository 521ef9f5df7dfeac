"""The deploy path vs ONNX Runtime itself: a loaded exported program's call, and where the gap goes.

Models (from `benchmarks/ort_overhead.py`, small configs, random weights): DistilBERT,
ConvNeXt, Swin, and `tiny` (Linear(8, 8) + ReLU on a 2x8 input: the fixed per-call cost,
where ORT's own work is a few microseconds). Each is exported with chain("onnxruntime",
"eager"), saved, loaded with `chain.load`; then, side by side in one process, the median
latency of:

- `direct`: a bare `sess.run` on `torch.onnx.export(model, dynamo=True)`;
- `direct_torch` (CPU): the same `sess.run` with its outputs as torch tensors
  (`torch.from_numpy`, no copy): what a PyTorch caller of ONNX Runtime gets, and what the
  program returns (`direct` hands back numpy arrays);
- `session`: a bare `sess.run` on the payload's own ONNX model (the graph's part);
- `runner`: the payload's runner (`chain.deploy.ops.runner_for`): I/O binding;
- `op`: `torch.ops.backend_chain.run_payload` on the payload: op dispatch;
- `graph`: `LeanModule(program, direct=False)`: our input check, the lifted graph's code
  (the op), the outputs' structure;
- `program`: the loaded program's `module()(*args)`: the program call (`LeanModule`: for a
  program that is one CPU payload call, the runner's plain entry without the graph);
- `old_forward`: torch's `module(lean=False).forward(*args)`: torch's unlifted graph code
  (pytree flatten, `_guards_fn` shape checks, the op, unflatten), without nn.Module hooks;
- `old`: torch's `module(lean=False)(*args)`: the previous program call (adds torch's
  input-structure pre-hook), timed in the same rounds for comparison.

All sessions (direct, session, and the one `chain.load` built) use the same options
(`backends.common.ort_session.session_options()`); the script checks them (threads,
optimization level, execution mode, spinning) and prints them. Rounds interleave the
variants in rotated order after a warm-up, each round one untimed call per variant; the
table gives medians over rounds and `paired`, the median over rounds of program/direct
timed in the same round (steadier when other processes' load drifts). Attribution, per
model (ms per call): session = session - direct, I/O binding = runner - session, op
dispatch = op - runner, graph call = graph - op, and the program over direct ORT (program
- direct); and what the old path cost over ours (old - program, of which torch's input
check hook = old - old_forward).

With `--gap-ms G` every timed call comes G ms after the previous one returned (a serving
process between requests: ONNX Runtime's and torch's pool threads have gone to sleep), and
each call is timed alone. `--size tiny` takes tiny configs (DistilBERT, ViT, ConvNeXt,
GPT-2; 1-3 ms a call) where a fixed per-call cost shows most. Its `_mo` models return
transformers `ModelOutput`s, tiny configs of the issue-47 models: `distilbert_mo`,
`bert_mo`, `gpt2_mo`, `roberta_mo`, `llama_mo` (LlamaModel, `use_cache=False`),
`resnet_mo` (ResNetModel) and `clip_vision_mo` (CLIPVisionModel); `--models mo` runs all
seven (and the geomean is theirs). Direct ORT runs the same model returning a tuple;
`walked` is the program call rebuilding its outputs with `pytree.tree_unflatten` at every
call (the path before `chain/deploy/rebuild.py`). The figure of issue 47 is each `_mo`
model's `program/direct` (and its `paired` ratio) with `--gap-ms 20`: target 1.05 or less.

    python benchmarks/export_overhead.py [--models distilbert convnext swin tiny]
        [--size base|tiny] [--gap-ms 0] [--rounds 30] [--calls 5]
    python benchmarks/export_overhead.py --size tiny --models mo --gap-ms 20 --rounds 40
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import chain
from backends.common.ort_session import session_options
from backends.common.payload import tensor_bytes, unpack
from benchmarks.ort_overhead import (
    MODELS,
    Built,
    Unwrapped,
    bare_run,
    direct_model,
    ort_session,
    time_rounds,
)
from chain.deploy import LeanModule, ops

OP = torch.ops.backend_chain.run_payload.default
KEYS = ("direct", "direct_torch", "session", "runner", "op", "graph", "program", "walked",
        "old_forward", "old")  # fmt: skip
STEPS = (("session", "session", "direct"), ("I/O binding", "runner", "session"),
         ("op dispatch", "op", "runner"), ("graph call", "graph", "op"),
         ("program over direct", "program", "direct"),
         ("outputs rebuilt by tree_unflatten", "walked", "program"),
         ("| old path over ours", "old", "program"),
         ("(torch's input check hook)", "old", "old_forward"))  # fmt: skip
MAIN = ("distilbert", "convnext", "swin")  # the geomean's models
TINY = ("distilbert", "vit", "convnext", "gpt2")  # --size tiny: the geomean's models
# --size tiny, returning ModelOutputs: `--models mo`
MODEL_OUTPUTS = ("distilbert_mo", "bert_mo", "gpt2_mo", "roberta_mo", "llama_mo", "resnet_mo",
                 "clip_vision_mo")  # fmt: skip


def tiny() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """A model whose ORT run takes microseconds: what is left is the fixed per-call cost."""
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()), (torch.randn(2, 8),)


def tiny_configs() -> dict[str, Callable[[], Built]]:
    """Tiny configs of four architectures (hidden 32-64, 2 layers; 1-3 ms a call)."""
    import transformers as tf

    def distilbert() -> Built:
        config = tf.DistilBertConfig(
            vocab_size=1000, dim=64, n_layers=2, n_heads=4, hidden_dim=128,
            max_position_embeddings=64,
        )  # fmt: skip
        ids = torch.randint(0, 1000, (2, 16))
        return Unwrapped(tf.DistilBertModel(config)), (ids, torch.ones(2, 16, dtype=torch.long))

    def vit() -> Built:
        config = tf.ViTConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            image_size=32, patch_size=8,
        )  # fmt: skip
        return Unwrapped(tf.ViTModel(config)), (torch.randn(2, 3, 32, 32),)

    def convnext() -> Built:
        config = tf.ConvNextConfig(hidden_sizes=[16, 32, 64, 64], depths=[1, 1, 1, 1])
        return Unwrapped(tf.ConvNextModel(config)), (torch.randn(2, 3, 32, 32),)

    def gpt2() -> Built:
        config = tf.GPT2Config(
            vocab_size=1000, n_embd=64, n_layer=2, n_head=4, n_positions=64, use_cache=False
        )
        return Unwrapped(tf.GPT2Model(config)), (torch.randint(0, 1000, (2, 16)),)

    def bert_mo() -> Built:
        config = tf.BertConfig(
            vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128, max_position_embeddings=64,
        )  # fmt: skip
        return tf.BertModel(config), (torch.randint(0, 1000, (2, 16)),)

    def roberta_mo() -> Built:
        config = tf.RobertaConfig(
            vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128, max_position_embeddings=66,
        )  # fmt: skip
        return tf.RobertaModel(config), (torch.randint(3, 1000, (2, 16)),)

    def llama_mo() -> Built:
        config = tf.LlamaConfig(
            vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64,
            use_cache=False,
        )  # fmt: skip
        return tf.LlamaModel(config), (torch.randint(0, 1000, (2, 16)),)

    def resnet_mo() -> Built:
        config = tf.ResNetConfig(
            embedding_size=16, hidden_sizes=[16, 32, 64, 64], depths=[1, 1, 1, 1],
            layer_type="basic",
        )  # fmt: skip
        return tf.ResNetModel(config), (torch.randn(2, 3, 32, 32),)

    def clip_vision_mo() -> Built:
        config = tf.CLIPVisionConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            image_size=32, patch_size=8, projection_dim=32,
        )  # fmt: skip
        return tf.CLIPVisionModel(config), (torch.randn(2, 3, 32, 32),)

    def returning_outputs(build: Callable[[], Built]) -> Callable[[], Built]:
        """The same model returning its `ModelOutput` (not unwrapped to a tuple)."""

        def built() -> Built:
            model, args = build()
            return model.model if isinstance(model, Unwrapped) else model, args

        return built

    return {
        "distilbert": distilbert, "vit": vit, "convnext": convnext, "gpt2": gpt2,
        "distilbert_mo": returning_outputs(distilbert), "bert_mo": bert_mo,
        "gpt2_mo": returning_outputs(gpt2), "roberta_mo": roberta_mo, "llama_mo": llama_mo,
        "resnet_mo": resnet_mo, "clip_vision_mo": clip_vision_mo,
    }  # fmt: skip


def time_gapped(
    runs: dict[str, Callable], args: tuple[torch.Tensor, ...], rounds: int, calls: int, gap_s: float
) -> dict[str, list[float]]:
    """Per round, the median ms of `calls` calls of each variant, each call `gap_s` after the
    last one returned and timed alone; variants in rotated order, warmed up first."""
    for fn in runs.values():
        for _ in range(3):
            fn(*args)
    times: dict[str, list[float]] = {k: [] for k in runs}
    keys = list(runs)
    for r in range(rounds):
        for key in keys[r % len(keys) :] + keys[: r % len(keys)]:
            fn, samples = runs[key], []
            for _ in range(calls):
                time.sleep(gap_s)
                start = time.perf_counter()
                fn(*args)
                samples.append((time.perf_counter() - start) * 1e3)
            times[key].append(statistics.median(samples))
    return times


def options_of(session: Any) -> dict[str, str]:
    """The session options that change speed: threads, optimization level, mode, spinning."""
    so = session.get_session_options()
    return {
        "intra_op_threads": str(so.intra_op_num_threads),
        "inter_op_threads": str(so.inter_op_num_threads),
        "optimization": str(so.graph_optimization_level).rsplit(".", 1)[-1],
        "execution_mode": str(so.execution_mode).rsplit(".", 1)[-1],
        "spinning": so.get_session_config_entry("session.intra_op.allow_spinning"),
    }


def variants(model: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> dict[str, Callable]:
    """The variants of the table, built and ready; the sessions' options checked equal."""
    device = args[0].device
    result = chain.export(model, args, backend=chain.chain("onnxruntime", "eager", measure=False))
    with tempfile.TemporaryDirectory() as folder:
        torch.export.save(result.program, Path(folder) / "program.pt2")
        program = chain.load(Path(folder) / "program.pt2")
    module = program.module()
    if not isinstance(module, LeanModule):
        raise RuntimeError(f"chain.load gave {type(module).__name__}, not the lean call")
    old = program.module(lean=False)
    plain = model if isinstance(model, Unwrapped) or not _outputs_structured(model, args) else None
    direct_of = plain if plain is not None else Unwrapped(model)  # direct ORT: tensors out
    direct = ort_session(direct_model(direct_of, args), session_options(), device)
    runs: dict[str, Callable] = {"direct": bare_run(direct, device)}
    if device.type == "cpu":
        numpy_out = runs["direct"]
        runs["direct_torch"] = lambda *xs: list(map(torch.from_numpy, numpy_out(*xs)))
    calls = [n for n in program.graph.nodes if n.target is OP]
    users = {name: k for k, name in enumerate(program.graph_signature.user_inputs)}
    if len(calls) == 1 and all(a.name in users for a in calls[0].args[0]):
        node = calls[0]
        positions = [users[a.name] for a in node.args[0]]
        specs = {s.arg.name: s.target for s in program.graph_signature.input_specs}
        payload = program.constants[specs[node.args[1].name]]
        outputs = node.args[2]
        _, body = unpack(tensor_bytes(payload))
        session = ort_session(bytes(body), session_options(), device)
        runner = ops.runner_for(payload, device, outputs)
        loaded = getattr(runner, "session", None)  # the session chain.load built (CPU)
        checked = {"direct": direct, "session": session}
        if loaded is not None:
            checked["loaded"] = loaded
        seen = {name: options_of(s) for name, s in checked.items()}
        if len({tuple(o.items()) for o in seen.values()}) != 1:
            raise RuntimeError(f"session options differ, the comparison is unfair: {seen}")
        print(f"  session options ({', '.join(seen)}): {seen['direct']}")

        def pick(xs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
            return [xs[p] for p in positions]

        bare = bare_run(session, device)
        runs["session"] = lambda *xs: bare(*pick(xs))
        runs["runner"] = lambda *xs: runner(pick(xs))
        runs["op"] = lambda *xs: OP(pick(xs), payload, outputs)
    else:
        print(f"  ({len(calls)} payload calls: session/runner/op variants left out)")
    runs["graph"] = LeanModule(program, direct=False)
    runs["program"] = module
    if plain is None:  # a ModelOutput: the program call as it rebuilt outputs before
        runs["walked"] = _walked(program)
    runs["old_forward"] = old.forward
    runs["old"] = old
    return runs


def _outputs_structured(model: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> bool:
    """Whether the model returns a transformers `ModelOutput` (a dict-like structure)."""
    with torch.no_grad():
        return isinstance(model(*args), dict)


def _walked(program: Any) -> LeanModule:
    """The lean call with the old rebuild: `pytree.tree_unflatten` walking the spec each call."""
    from torch.utils import _pytree as pytree

    import chain.deploy.program as lean

    prepared = lean.rebuilder
    lean.rebuilder = lambda spec: lambda flat: pytree.tree_unflatten(flat, spec)
    try:
        return LeanModule(program)
    finally:
        lean.rebuilder = prepared


def paired(times: dict[str, list[float]], a: str, b: str) -> float:
    """The median over rounds of a/b measured in the same round."""
    return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=[*MAIN, "tiny"])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--size", choices=("base", "tiny"), default="base")
    parser.add_argument("--gap-ms", type=float, default=0.0, help="idle ms before each call")
    ns = parser.parse_args()
    if ns.gap_ms < 0:
        parser.error("--gap-ms: expected 0 or more milliseconds")
    builders = tiny_configs() if ns.size == "tiny" else {**MODELS, "tiny": tiny}
    if ns.size == "tiny" and ns.models == parser.get_default("models"):
        ns.models = list(TINY)
    if ns.size == "tiny" and ns.models == ["mo"]:
        ns.models = list(MODEL_OUTPUTS)
    unknown = [m for m in ns.models if m not in builders]
    if unknown:
        parser.error(f"--models: unknown {unknown} for --size {ns.size}; one of {list(builders)}")
    geo = TINY if ns.size == "tiny" else MAIN
    if ns.size == "tiny" and all(m in MODEL_OUTPUTS for m in ns.models):
        geo = MODEL_OUTPUTS
    rows: list[tuple[str, dict[str, float], dict[str, list[float]]]] = []
    for name in ns.models:
        torch.manual_seed(0)
        model, args = builders[name]()
        model.eval()
        print(f"{name}:")
        with torch.no_grad():
            runs = variants(model, args)
            if ns.gap_ms > 0:
                times = time_gapped(runs, args, ns.rounds, ns.calls, ns.gap_ms / 1e3)
            else:
                times = time_rounds(runs, args, ns.rounds, ns.calls)
        rows.append((name, {k: statistics.median(v) for k, v in times.items()}, times))
    gap = f", {ns.gap_ms:g} ms idle before each call" if ns.gap_ms > 0 else ", back to back"
    print(
        f"median ms per call, {ns.size} configs, {ns.rounds} rounds x {ns.calls} calls{gap}, "
        f"interleaved, one process; torch threads {torch.get_num_threads()}"
    )
    head = "".join(f"{k:>13}" for k in KEYS)
    print(f"{'model':12}{head}{'program/direct':>16}{'paired':>8}{'old/direct':>12}{'paired':>8}")
    for name, med, times in rows:
        cells = "".join(f"{med[k]:13.3f}" if k in med else f"{'-':>13}" for k in KEYS)
        ratios = "".join(
            f"{med[k] / med['direct']:{w}.3f}{paired(times, k, 'direct'):8.3f}"
            for k, w in (("program", 16), ("old", 12))
        )
        print(f"{name:12}{cells}{ratios}")
    main = [(n, med, times) for n, med, times in rows if n in geo]
    names = ", ".join(n for n, _, _ in main)
    for key in ("program", "old"):
        print(
            f"geomean {key}/direct ({names}): "
            f"{geomean([med[key] / med['direct'] for _, med, _ in main]):.3f} (ratio of "
            f"medians), {geomean([paired(t, key, 'direct') for _, _, t in main]):.3f} "
            "(median of per-round ratios)"
        )
    for name, med, _ in rows:
        if name == "tiny":
            print(f"fixed per-call cost (tiny, program - direct): "
                  f"{med['program'] - med['direct']:.3f} ms (old path: "
                  f"{med['old'] - med['direct']:.3f} ms)")  # fmt: skip
    for name, med, times in rows:
        if "walked" in med:
            print(
                f"{name}: program/direct {med['program'] / med['direct']:.3f} (paired "
                f"{paired(times, 'program', 'direct'):.3f}), walked/direct "
                f"{med['walked'] / med['direct']:.3f} "
                f"(paired {paired(times, 'walked', 'direct'):.3f})"
            )
    for name, med, times in rows:
        if "direct_torch" in med:
            print(
                f"{name}: program/direct_torch {med['program'] / med['direct_torch']:.3f} "
                f"(paired {paired(times, 'program', 'direct_torch'):.3f})"
            )
    print("attribution (ms per call):")
    for name, med, _ in rows:
        parts = [f"{label} {med[a] - med[b]:+.3f}" for label, a, b in STEPS if a in med]
        print(f"  {name:12} " + ", ".join(parts))


if __name__ == "__main__":
    main()
