"""Heaviest test files first, so the two pytest-xdist workers finish together.

`--dist loadfile` hands out whole files; by default pytest-xdist orders them by their count
of tests, so a file of two tests that each start second processes (a minute or more) came
last and one worker ran it alone while the other sat idle (the 'last 5%' of a run took
minutes). The suite orders files by their recorded seconds instead (`file_seconds.json`, a
`--durations=0` run's per-file sums: longest first is the classic greedy schedule); a file
not recorded yet counts as the median. Refresh the record after a change of weight:

    python -m pytest -q -n 2 --dist loadfile -m "not timing" --durations=0 \
        --durations-min=0.5 > durations.log
    python -m tests.file_order durations.log
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import pytest

RECORD = Path(__file__).with_name("file_seconds.json")
_PHASE = re.compile(r"^([0-9.]+)s (?:call|setup|teardown)\s+(\S+?)::")


def weights() -> dict[str, float]:
    """Recorded seconds per test file (its path relative to the repository)."""
    return json.loads(RECORD.read_text()) if RECORD.exists() else {}


def heaviest_first(items: list[pytest.Item], seconds: dict[str, float]) -> None:
    """Sort `items` in place by their file's seconds, heaviest first; stable, so each
    file's tests keep their order."""
    default = statistics.median(seconds.values()) if seconds else 0.0
    items.sort(key=lambda item: -seconds.get(item.location[0], default))


def record(log: str) -> dict[str, float]:
    """Per-file sums of a pytest `--durations` report's setup, call and teardown lines."""
    sums: dict[str, float] = defaultdict(float)
    for line in log.splitlines():
        match = _PHASE.match(line)
        if match:
            sums[match.group(2)] += float(match.group(1))
    return {path: round(s, 1) for path, s in sorted(sums.items(), key=lambda kv: -kv[1])}


if __name__ == "__main__":
    RECORD.write_text(json.dumps(record(Path(sys.argv[1]).read_text()), indent=1) + "\n")
    print(f"{RECORD}: {len(json.loads(RECORD.read_text()))} files")
