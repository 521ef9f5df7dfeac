"""`python -m chain report FILE | demo | bench | store` (also the `chain` console script)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rich.console import Console

from backends.common.files import UnsafeFile
from chain.report import json_fields as jf
from chain.report.columns import printable
from chain.report.report import SHOWN_FAILURES, Report, ReportError


def _report(args: argparse.Namespace) -> int:
    try:
        report = Report.load(args.file)
    except ReportError as e:
        print(f"chain: error: {printable(str(e))}", file=sys.stderr)
        return 2
    if args.format == "html":
        if not args.output:
            print("chain: error: --format html needs -o FILE", file=sys.stderr)
            return 2
        try:
            written = report.save_html(args.output)
        except OSError as e:  # UnsafeFile (a folder, FIFO, device or link at -o) or the disk's
            print(f"chain: error: {printable(_write_error(args.output, e))}", file=sys.stderr)
            return 2
        print(f"wrote {written}")
        return 0
    if args.format == "json":
        data = report.to_dict()
        if args.failures:
            failures = {s.value for s in SHOWN_FAILURES}
            for g in data["graphs"]:
                g["attempts"] = [a for a in g["attempts"] if a["status"] in failures]
        print(jf.dumps(data, indent=2))
    elif args.format == "markdown":
        print(report.to_markdown(args.failures), end="")
    elif args.format == "csv":
        print(report.to_csv(args.failures), end="")
    else:
        console = _console()
        console.print(report.table(args.failures, console.width))
    return 0


def _console() -> Console:
    """The terminal's console at its width; piped, at least 120 columns (COLUMNS)."""
    console = Console()
    return console if console.is_terminal else Console(width=max(120, console.width))


def _write_error(path: str, e: OSError) -> str:
    """One line for a failed write of `path`: the file layer's refusal, or the OS's reason."""
    if isinstance(e, UnsafeFile):
        return str(e)
    return f"{path}: cannot write: {e.strerror or e}"


def _repro(args: argparse.Namespace) -> int:
    """Write a repro; one line and exit 2 for a bad report, size, target or untrusted file."""
    from chain.report.look.repro import ReproError, parse_size, write

    try:
        sizes = dict(parse_size(s) for s in args.size)
        report = Report.load(args.file)
        _trusted(args.file, args.trust)
        script = write(report, args.graph, args.backend, args.output, sizes, args.file)
    except (ReportError, ReproError) as e:
        print(f"chain: error: {printable(str(e))}", file=sys.stderr)
        return 2
    except OSError as e:  # UnsafeFile (a link, FIFO or device at -o) or the disk's reason
        print(f"chain: error: {printable(_write_error(args.output, e))}", file=sys.stderr)
        return 2
    print(f"wrote {printable(str(script))}: python {printable(str(script))}")
    return 0


def _trusted(path: str, trust: bool) -> None:
    """A repro runs the graph code recorded in the report: one you did not make needs
    --trust (chain.report.look.repro.made_by_you says what "made" means)."""
    from chain.report.look.repro import ReproError, made_by_you

    why = None if trust else made_by_you(path)
    if why is not None:
        raise ReproError(
            f"{path}: {why}: its repro would run the code it records; read it, then pass --trust"
        )


def _bench(argv: Sequence[str]) -> int:
    from chain.bench.run import main as bench_main

    return int(bench_main(list(argv)) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        return _bench(argv[1:])
    if argv[:1] == ["store"]:  # remembered decisions (chain.memory)
        from chain.memory.tools import main as store_main

        return store_main(argv[1:])
    if argv[:1] == ["demo"]:
        from chain.demo import main as demo_main

        return demo_main(argv[1:])
    parser = argparse.ArgumentParser(prog="chain", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="print a saved report (JSON written by Report.save)")
    rep.add_argument("file", help="the report's JSON file (Report.save, report_path=)")
    rep.add_argument(
        "--format",
        choices=("table", "markdown", "csv", "json", "html"),
        default="table",
        help="how to print it (default: table; html needs -o FILE)",
    )
    rep.add_argument("-o", "--output", metavar="FILE", help="where --format html writes the page")
    rep.add_argument(
        "--failures",
        action="store_true",
        help="only the attempts that failed, then each one's whole reason",
    )
    rep = sub.add_parser("repro", help="write a standalone repro of one backend on one graph")
    rep.add_argument("file", help="the report's JSON file (Report.save, report_path=)")
    rep.add_argument("graph", type=int, help="the graph's id (the report's `graph` column)")
    rep.add_argument("backend", help="the backend to run on it, as the report names it")
    rep.add_argument("-o", "--output", metavar="DIR", required=True, help="where to write it")
    rep.add_argument(
        "--size", action="append", default=[], metavar="NAME=N", help="a symbolic size's value"
    )
    rep.add_argument("--trust", action="store_true", help="write it for a report you did not make")
    sub.add_parser("bench", help="run the benchmark (chain bench --help)")
    sub.add_parser("demo", help="compile a small model through the default chain")
    sub.add_parser("store", help="remembered decisions: list, show KEY, clear (chain store -h)")
    args = parser.parse_args(argv)
    return _repro(args) if args.command == "repro" else _report(args)


if __name__ == "__main__":
    sys.exit(main())
