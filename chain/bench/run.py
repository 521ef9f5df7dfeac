"""`chain bench` (and `python benchmarks/run.py`): each backend and chain on a model suite.

Answers: on this machine, for models like mine, what does each backend and each chain
give me, and what does the chain cost? Prints a table, writes CSV, JSON, a markdown
summary and (with matplotlib) a bar chart into `--out`.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from backends.options import THREADS_PER_CORE
from chain.bench.candidates import (
    DEFAULT_CHAIN,
    KNOWN_BACKENDS,
    MODES,
    backend_names,
    build_candidates,
    thread_options,
)
from chain.bench.harness import Result, Settings, bench_model, warm_dynamo
from chain.bench.models import QUICK_MODELS, SUITE, ModelSpec, default_models
from chain.bench.output import to_table, write_all
from chain.bench.peers import peer_candidates
from chain.bench.real_models import QUICK_REAL_MODELS, REAL_SUITE

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
SUITES: dict[str, dict[str, ModelSpec]] = {"default": SUITE, "real": REAL_SUITE}


def names_list(
    valid: Callable[[], Sequence[str]], what: str, allow_none: bool = False
) -> Callable[[str], list[str]]:
    """An argparse type: comma-separated names, each one of `valid()`, or 'none' if allowed."""

    def parse(text: str) -> list[str]:
        if allow_none and text.strip() == "none":
            return []
        names = [n.strip() for n in text.split(",") if n.strip()]
        choices = list(valid())
        bad = [n for n in names if n not in choices]
        if bad or not names:
            shown = ", ".join(bad) if bad else "(empty)"
            extra = " (or 'none')" if allow_none else ""
            raise argparse.ArgumentTypeError(
                f"invalid {what}: {shown}; valid: {', '.join(choices)}{extra}"
            )
        return names

    return parse


def positive(minimum: int, maximum: int) -> Callable[[str], int]:
    """An argparse type: an integer from `minimum` to `maximum` (a typo cannot run for days
    or start a million threads)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum} and <= {maximum}, got {value}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    """The command line; defaults of None are filled from `--quick` or the full run."""
    p = argparse.ArgumentParser(prog="chain bench", description=__doc__.splitlines()[0])
    models = ", ".join(f"{n} ({s.doc})" for n, s in (SUITE | REAL_SUITE).items())
    p.add_argument(
        "--models",
        type=names_list(lambda: list(SUITE | REAL_SUITE), "model"),
        help=f"comma-separated: {models}",
    )
    p.add_argument(
        "--suite",
        choices=tuple(SUITES),
        default="default",
        help="default: small models built in code; real: timm and transformers models from "
        "configs (random weights) with the peer columns inductor[reduce-overhead] and "
        "onnxruntime-direct",
    )
    backends_help = f"comma-separated single backends (default {','.join(KNOWN_BACKENDS)})"
    p.add_argument(
        "--backends",
        type=names_list(backend_names, "backend", allow_none=True),
        help=backends_help + ", or 'none'",
    )
    p.add_argument(
        "--chains",
        nargs="+",
        type=names_list(backend_names, "chain backend", allow_none=True),
        help=f"chains, each comma-separated (default {','.join(DEFAULT_CHAIN)}), or 'none'",
    )
    p.add_argument(
        "--modes",
        type=names_list(lambda: MODES, "mode"),
        default=list(MODES),
        help="chain modes to run (default first,fastest)",
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--batch-size", type=positive(1, 4096), help="override every model's batch size")
    p.add_argument(
        "--dtype", choices=tuple(DTYPES), default="fp32", help="fp16/bf16 need --device cuda"
    )
    p.add_argument(
        "--repeats", type=positive(1, 10_000), help="timed rounds (default 20; 5 with --quick)"
    )
    p.add_argument(
        "--warmup", type=positive(0, 1000), help="warm-up rounds (default 3; 1 with --quick)"
    )
    p.add_argument(
        "--threads",
        type=positive(1, THREADS_PER_CORE * (os.cpu_count() or 1)),
        help="CPU threads for torch and onnxruntime (default: theirs)",
    )
    p.add_argument(
        "--out", type=Path, default=Path("bench-out"), help="output folder (default bench-out/)"
    )
    p.add_argument("--quick", action="store_true", help="two tiny models, few repeats: a smoke run")
    return p


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse and check combinations; any bad input exits with code 2 and a clear message."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here (torch.cuda.is_available() is False)")
    if args.dtype != "fp32" and args.device != "cuda":
        parser.error(f"--dtype {args.dtype} needs --device cuda (CPU runs are fp32 only)")
    suite = SUITES[args.suite]
    if args.suite == "real":  # every model is a row: the ones that cannot be built say why
        args.models = args.models or list(QUICK_REAL_MODELS if args.quick else REAL_SUITE)
    else:
        args.models = args.models or (list(QUICK_MODELS) if args.quick else default_models())
    for name in args.models:
        if name not in suite:
            parser.error(f"--models {name}: not in --suite {args.suite} ({', '.join(suite)})")
        reason = suite[name].available()
        if reason and args.suite != "real":
            parser.error(f"--models {name}: {reason}")
    args.backends = KNOWN_BACKENDS if args.backends is None else args.backends
    chains = [list(DEFAULT_CHAIN)] if args.chains is None else args.chains
    args.chains = [c for c in chains if c]
    args.repeats = args.repeats or (5 if args.quick else 20)
    args.warmup = (1 if args.quick else 3) if args.warmup is None else args.warmup
    return args


def busy_note(load: float, threads: int | None) -> str | None:
    """A warning when other work shared the cores during the run (figures are then noisy)."""
    cores = os.cpu_count() or 1
    if load <= 0.5 * cores:
        return None
    hint = "" if threads == 1 else "; --threads 1 steadies CPU figures when cores are shared"
    busy = f"note: this machine was busy (load {load:.1f} on {cores} cores): "
    return busy + "expect noisy figures (see the spread column)" + hint


def machine() -> str:
    """One line about where the figures come from."""
    cpu = platform.processor() or platform.machine()
    threads = torch.get_num_threads()
    system = f"{platform.system()} {cpu}, {os.cpu_count()} cores"
    return f"{system}, {threads} threads, torch {torch.__version__}"


def run(args: argparse.Namespace, console: Console) -> tuple[dict[str, Any], list[Result]]:
    """Every model through every candidate, with a progress bar; returns (meta, rows)."""
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    if args.threads:
        torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    settings = Settings(repeats=args.repeats, warmup=args.warmup)
    options = thread_options(args.threads)
    candidates = build_candidates(args.backends, args.chains, args.modes, options)
    if args.suite == "real":
        candidates[1:1] = peer_candidates(args.threads)  # after eager, before the backends
    suite = SUITES[args.suite]
    rows: list[Result] = []
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    per_model = len(candidates) + 1 + settings.repeats
    warm_dynamo()
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("benchmark", total=per_model * len(args.models))

        def step(text: str) -> None:
            progress.update(task, advance=1, description=text)

        for name in args.models:
            if reason := suite[name].available():
                rows.append(Result(name, "eager", "eager", "unavailable", reason))
                step(f"{name}: {reason}")
                continue
            torch._dynamo.reset()  # each model compiles from scratch
            model, inputs = suite[name].build(args.batch_size, device, dtype, tiny=args.quick)
            with torch._dynamo.config.patch(recompile_limit=64):  # one entry per candidate
                rows += bench_model(name, model, inputs, candidates, settings, step)
    meta = {
        "command": "chain bench " + " ".join(args.argv),
        "machine": machine(),
        "device": args.device,
        "dtype": args.dtype,
        "threads": torch.get_num_threads(),
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "quick": args.quick,
        "suite": args.suite,
        "models": args.models,
        "candidates": [c.label for c in candidates],
        "options": options,
        "python": platform.python_version(),
        "load_before": round(load, 2),
        "load_after": round(os.getloadavg()[0], 2),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    return meta, rows


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `chain bench` and `python benchmarks/run.py`; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    args.argv = argv
    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = max(console.width, 200)  # a log file, not a window: keep rows whole
    threads = torch.get_num_threads()
    try:
        meta, rows = run(args, console)
    finally:
        torch.set_num_threads(threads)  # `chain bench` may run inside a longer process
    console.print(to_table(rows, f"{meta['device']} {meta['dtype']}, {meta['machine']}"))
    note = busy_note(max(meta["load_before"], meta["load_after"]), args.threads)
    if note:
        console.print(note, markup=False)
    paths, skipped = write_all(args.out, meta, rows)
    if skipped:
        console.print(f"note: {skipped}", markup=False)
    console.print("wrote " + ", ".join(str(p) for p in paths), markup=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
