"""Mixed regions (issue 49): a hybrid model and a uniform control, each served by eager, by
each single backend alone, by the chain's whole-graph winner (mode "fastest") and by the
mixed regions (mode "fastest", regions=True); compile time of each.

Models from configs, random weights: `dual`, a CLIP-like dual encoder (transformers'
VisionTextDualEncoderModel: a small ConvNeXt vision tower on 32x32 images, a small BERT
text tower on 256 tokens); `captioner`, a vision encoder-decoder (transformers'
VisionEncoderDecoderModel: a small ViT encoder on 32x32 images, a small GPT-2 decoder with
cross-attention on 64 tokens); `captioner_convnext`, the issue's captioner (a ConvNeXt
encoder, ConvNeXt-atto's depths at small widths, on 64x64 images, its 2x2 feature map
projected to 4 tokens that a small GPT-2 decoder reads by cross-attention over 256 tokens);
`whisper`, Whisper's encoder; uniform controls `bert` (the small BERT on 256 tokens),
`gpt2` (a small GPT-2 on 256 tokens), `resnet` (a small transformers ResNet on 64x64).
The hybrids' halves (the dual encoder's towers, the ConvNeXt captioner's encoder and decoder)
are also timed apart under each backend: the ideal mix.
One thread (torch.set_num_threads, ONNX Runtime's intra_op_num_threads) unless told; every
variant timed side by side in interleaved rounds (shuffled order, `--calls` calls a round,
medians), no_grad.
Compile time: the first call's wall time (dynamo, selection, compiles, verification).
"mixed, warm start": a second chain on the decision store the mixed run kept (its plan
rebuilt: each part compiled under its remembered backend, verified, nothing tried or timed).
Single backends run unverified (verify=False): a peer's speed whether or not it passes the
chain's accuracy rule (ONNX Runtime alone fails it on the dual encoder's outputs here).
The figures are this machine's at this load: the load average is printed before and after.

    python benchmarks/regions.py [--models dual captioner bert gpt2 resnet] [--rounds 30]
        [--calls 5] [--threads 1] [--backends onnxruntime inductor]
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chain import chain
from chain.bench.candidates import thread_options
from chain.judge.timing import compare
from chain.report.regions import region_lines
from chain.select.regions.mix import REGIONS

TEXT_TOKENS = 256
# every variant selects afresh (no remembered decision) and no challenger compiles while timed
FRESH: dict[str, Any] = {"memory": False, "challengers": None}


def fresh(backends: list[str], threads: int) -> dict[str, Any]:
    """FRESH, with ONNX Runtime's own thread pool held to `threads` (its default is every
    core: at 1 torch thread it ran on 2 here, a comparison no fairer than its figures)."""
    opts = {k: v for k, v in thread_options(threads).items() if k in backends}
    return {**FRESH, "options": opts} if opts else FRESH


def _text_config() -> Any:
    from transformers import BertConfig

    return BertConfig(
        vocab_size=1000, hidden_size=64, num_hidden_layers=4, num_attention_heads=2,
        intermediate_size=128, max_position_embeddings=TEXT_TOKENS,
    )  # fmt: skip


def dual() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """A CLIP-like dual encoder: ConvNeXt vision tower (32x32), BERT text tower (256 tokens)."""
    from transformers import VisionTextDualEncoderConfig, VisionTextDualEncoderModel

    config = VisionTextDualEncoderConfig.from_vision_text_configs(
        _vision_config(), _text_config(), projection_dim=32
    )
    model = VisionTextDualEncoderModel(config=config)
    ids = torch.randint(0, 1000, (1, TEXT_TOKENS))
    return model, (ids, torch.randn(1, 3, 32, 32))


def bert() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """The uniform control: the same small BERT alone (256 tokens)."""
    from transformers import BertModel

    return BertModel(_text_config()), (torch.randint(0, 1000, (1, TEXT_TOKENS)),)


def _vision_config() -> Any:
    from transformers import ConvNextConfig

    vision = ConvNextConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 2, 1], image_size=32)
    vision.hidden_size = vision.hidden_sizes[-1]  # the pooled width the other half reads
    return vision


def captioner() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """A vision encoder-decoder: ViT encoder (32x32, 4x4 patches), GPT-2 decoder with
    cross-attention (64 tokens). Not ConvNeXt: its last hidden state is a (B, C, H, W) map,
    which VisionEncoderDecoderModel hands the decoder's cross-attention unflattened."""
    from transformers import (
        GPT2Config,
        VisionEncoderDecoderConfig,
        VisionEncoderDecoderModel,
        ViTConfig,
    )

    decoder = GPT2Config(vocab_size=1000, n_embd=64, n_layer=4, n_head=2, n_positions=64,
                         add_cross_attention=True, is_decoder=True,
                         bos_token_id=0, eos_token_id=0)  # fmt: skip
    vit = ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=128, image_size=32, patch_size=4)  # fmt: skip
    config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(vit, decoder)
    model = VisionEncoderDecoderModel(config=config)
    ids = torch.randint(0, 1000, (1, 64))
    return _Positional(model, ("pixel_values", "decoder_input_ids")), (
        torch.randn(1, 3, 32, 32),
        ids,
    )


class _ConvNextCaptioner(torch.nn.Module):
    """ConvNeXt encoder -> linear bridge -> GPT-2 decoder with cross-attention: the logits.
    Written out because VisionEncoderDecoderModel hands ConvNeXt's (B, C, H, W) map to the
    decoder unflattened."""

    def __init__(self, tokens: int) -> None:
        super().__init__()
        from transformers import ConvNextModel, GPT2Config, GPT2LMHeadModel

        vision = _vision_config()
        vision.depths = [2, 2, 6, 2]  # ConvNeXt-atto's depths, at the dual tower's widths
        self.encoder = ConvNextModel(vision)
        decoder = GPT2Config(vocab_size=1000, n_embd=64, n_layer=4, n_head=2, n_positions=tokens,
                             add_cross_attention=True)  # fmt: skip
        self.bridge = torch.nn.Linear(vision.hidden_sizes[-1], decoder.n_embd)
        self.decoder = GPT2LMHeadModel(decoder)

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        """The image as tokens: the last feature map, flattened and projected."""
        return self.bridge(self.encoder(pixels).last_hidden_state.flatten(2).transpose(1, 2))

    def forward(self, pixels: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.decoder(input_ids=ids, encoder_hidden_states=self.encode(pixels)).logits


def captioner_convnext() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """The issue's captioner: ConvNeXt encoder (64x64 images: 4 visual tokens), GPT-2 decoder
    with cross-attention (256 tokens)."""
    ids = torch.randint(0, 1000, (1, TEXT_TOKENS))
    return _ConvNextCaptioner(TEXT_TOKENS), (torch.randn(1, 3, 64, 64), ids)


def whisper() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """Whisper's encoder: a convolutional front end (two conv1d over 80 mel bins, 1,000
    frames) and a small transformer over the 500 positions it leaves."""
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    config = WhisperConfig(
        d_model=64, encoder_layers=4, encoder_attention_heads=2, encoder_ffn_dim=128,
        max_source_positions=500, num_mel_bins=80,
    )  # fmt: skip
    return WhisperEncoder(config), (torch.randn(1, 80, 1000),)


def gpt2() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """A uniform control: a small GPT-2 (256 tokens)."""
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(vocab_size=1000, n_embd=64, n_layer=4, n_head=2, n_positions=TEXT_TOKENS)
    return GPT2Model(config), (torch.randint(0, 1000, (1, TEXT_TOKENS)),)


def resnet() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """A uniform control: a small transformers ResNet (64x64)."""
    from transformers import ResNetConfig, ResNetModel

    config = ResNetConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], embedding_size=16)
    return ResNetModel(config), (torch.randn(1, 3, 64, 64),)


class _Positional(torch.nn.Module):
    """`model` called with its keyword inputs given by position (the benchmark's args)."""

    def __init__(self, model: torch.nn.Module, names: tuple[str, ...]) -> None:
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *args: Any) -> Any:
        return self.model(**dict(zip(self.names, args, strict=True)))


MODELS: dict[str, Callable[[], tuple[torch.nn.Module, tuple[Any, ...]]]] = {
    "dual": dual,
    "captioner": captioner,
    "captioner_convnext": captioner_convnext,
    "whisper": whisper,
    "bert": bert,
    "gpt2": gpt2,
    "resnet": resnet,
}


def load() -> str:
    """The load averages (1, 5, 15 minutes) on this machine's CPUs."""
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


def compiled(model: torch.nn.Module, args: tuple[Any, ...], backend: Any
             ) -> tuple[Callable[..., Any], float]:  # fmt: skip
    """A copy of `model` under torch.compile with `backend`, and its first call's wall time
    (a copy each: no variant's compiled code is reset by another's, none reused)."""
    fast = torch.compile(copy.deepcopy(model), backend=backend, dynamic=False)
    start = time.perf_counter()
    with torch.no_grad():
        fast(*args)
    return fast, time.perf_counter() - start


def timed(runs: dict[str, Callable[..., Any]], args: tuple[Any, ...], rounds: int, calls: int
          ) -> dict[str, list[float]]:  # fmt: skip
    """Seconds per call of each variant in each of the interleaved rounds (warmed up first;
    every round runs every variant, in a shuffled order)."""
    times: dict[str, list[float]] = {k: [] for k in runs}
    keys = list(runs)
    with torch.no_grad():
        for fn in runs.values():
            for _ in range(5):
                fn(*args)
        for _ in range(rounds):
            random.shuffle(keys)
            for key in keys:
                start = time.perf_counter()
                for _ in range(calls):
                    runs[key](*args)
                times[key].append((time.perf_counter() - start) / calls)
    return times


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    """Median ms per call of each variant."""
    return {k: 1e3 * statistics.median(v) for k, v in times.items()}


def outcome(backend: Any) -> str:
    """Per graph: the winner, and the regions attempt's status and reason."""
    out = []
    for graph in backend.report.graphs:
        mixed = next((a for a in graph.attempts if a.backend == REGIONS), None)
        why = f"; regions {mixed.status.value}: {mixed.reason}" if mixed else ""
        out.append(f"graph {graph.id} ({graph.num_nodes} nodes): {graph.winner}{why}")
    return "\n  ".join(out)


def run(name: str, backends: list[str], rounds: int, calls: int, threads: int) -> None:
    torch._dynamo.reset()  # each model's variants start from no compiled code
    torch.manual_seed(0)
    model, args = MODELS[name]()
    model.eval()
    print(f"{name}: {load()} before", flush=True)
    runs: dict[str, Callable[..., Any]] = {"eager": model}
    compile_s: dict[str, float] = {"eager": 0.0}
    for b in backends:  # the peer alone, unverified: it may not pass the chain's check
        single = chain(b, verify=False, measure=False, **fresh([b], threads))
        runs[b], compile_s[b] = compiled(model, args, single)
    whole = chain(*backends, "eager", mode="fastest", **fresh(backends, threads))
    runs["whole-graph winner"], compile_s["whole-graph winner"] = compiled(model, args, whole)
    store = tempfile.mkdtemp(prefix="regions-store-")  # the mixed decision, for a warm start
    stored = {**fresh(backends, threads), "memory": True, "store": store}
    mixed = chain(*backends, "eager", mode="fastest", regions=True, **stored)
    runs["mixed"], compile_s["mixed"] = compiled(model, args, mixed)
    warm = chain(*backends, "eager", mode="fastest", regions=True, **stored)
    runs["mixed, warm start"], compile_s["mixed, warm start"] = compiled(model, args, warm)
    shutil.rmtree(store, ignore_errors=True)
    times = timed(runs, args, rounds, calls)
    med = medians(times)
    best = min(backends, key=lambda b: med[b])
    print(f"  whole-graph: {outcome(whole)}")
    print(f"  mixed: {outcome(mixed)}")
    print(f"  mixed, warm start (the same store): {outcome(warm)}")
    print(f"  {'variant':22}{'compile s':>11}{'median ms':>11}{'x best single':>15}")
    for key in runs:
        print(f"  {key:22}{compile_s[key]:11.1f}{med[key]:11.3f}{med[best] / med[key]:15.2f}")
    for key in ("mixed", "mixed, warm start"):  # paired by round: the rounds interleave
        print(f"  {key} against {best} alone: {compare(times[best], times[key]).interval()}")
    print(f"  best single backend: {best}; {load()} after", flush=True)
    print("\n".join(f"  {line}" for line in region_lines(mixed.report.graphs)), flush=True)
    if name in TOWERS:
        towers(name, backends, rounds, calls, threads)
    print(mixed.report.render(width=160) if os.environ.get("REGIONS_REPORT") else "", end="")


def _dual_towers() -> dict[str, tuple[torch.nn.Module, tuple[Any, ...]]]:
    """The dual encoder's two towers apart (same seed, same sizes): each tower with its
    projection, on its own input."""
    torch.manual_seed(0)
    model, (ids, pixels) = dual()
    model.eval()

    class Vision(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return model.visual_projection(model.vision_model(pixel_values=x).pooler_output)

    class Text(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return model.text_projection(model.text_model(input_ids=x).pooler_output)

    return {"vision": (Vision(), (pixels,)), "text": (Text(), (ids,))}


def _captioner_halves() -> dict[str, tuple[torch.nn.Module, tuple[Any, ...]]]:
    """The ConvNeXt captioner's encoder (with its bridge) and decoder apart (same seed), the
    decoder on the encoder's tokens."""
    torch.manual_seed(0)
    model, (pixels, ids) = captioner_convnext()
    model.eval()
    with torch.no_grad():
        tokens = model.encode(pixels)

    class Encoder(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return model.encode(x)

    class Decoder(torch.nn.Module):
        def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
            return model.decoder(input_ids=x, encoder_hidden_states=memory).logits

    return {"encoder": (Encoder(), (pixels,)), "decoder": (Decoder(), (ids, tokens))}


TOWERS: dict[str, Callable[[], dict[str, tuple[torch.nn.Module, tuple[Any, ...]]]]] = {
    "dual": _dual_towers,
    "captioner_convnext": _captioner_halves,
}


def towers(name: str, backends: list[str], rounds: int, calls: int, threads: int) -> None:
    """Each tower apart under each single backend (unverified, interleaved): the ideal mix
    is the sum of each tower's best, against the best single backend's sum."""
    best: dict[str, float] = {}
    sums: dict[str, float] = dict.fromkeys(backends, 0.0)
    for tower, (module, args) in TOWERS[name]().items():
        runs = {b: compiled(module, args, chain(b, verify=False, measure=False,
                                                **fresh([b], threads)))[0]
                for b in backends}  # fmt: skip
        med = medians(timed(runs, args, rounds, calls))
        for b in backends:
            sums[b] += med[b]
        best[tower] = min(med.values())
        print(f"  {tower} tower alone: " + ", ".join(f"{b} {med[b]:.3f} ms" for b in backends))
    single = min(sums.values())
    ideal = sum(best.values())
    print(f"  towers: best single backend {single:.3f} ms, ideal mix {ideal:.3f} ms: "
          f"{single / ideal:.2f}x; {load()}", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--backends", nargs="+", default=["onnxruntime", "inductor"])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    ns = parser.parse_args()
    torch.set_num_threads(ns.threads)
    # every variant compiles a copy of the model; transformers' shared forward wrappers
    # would pass dynamo's limit of 8 entries per code object, and the rest would run eager
    torch._dynamo.config.recompile_limit = 64
    for name in ns.models:
        run(name, ns.backends, ns.rounds, ns.calls, ns.threads)
    print(f"median ms per call, {ns.rounds} rounds x {ns.calls} calls, no_grad, torch threads "
          f"{torch.get_num_threads()}, ONNX Runtime intra-op threads {ns.threads}")  # fmt: skip


if __name__ == "__main__":
    main()
