"""The ```python blocks of README.md and docs/**/*.md run as they are written.

A block that must not run (it needs a GPU or the network, or it is a sketch) carries
`<!-- no-run: REASON -->` on the line before its fence; the reason is required. Each block
runs in a fresh namespace, in a temporary working directory, with remembered decisions off
(CHAIN_MEMORY=0), and with the backend and lowering-pass registries restored after it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

FENCE = re.compile(r"^```python\n(?P<code>.*?)^```", re.M | re.S)
NO_RUN = re.compile(r"<!--\s*no-run(?::\s*(?P<reason>.*?))?\s*-->\s*$")


def blocks() -> list[tuple[str, int, str, str | None]]:
    """(page, line, code, reason not to run) for every python block of the pages."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            mark = NO_RUN.search(before)
            reason = None if mark is None else (mark.group("reason") or "")
            found.append((str(page.relative_to(ROOT)), line, match.group("code"), reason))
    return found


BLOCKS = blocks()


def test_the_pages_have_blocks_to_run() -> None:
    assert any(page == "README.md" for page, *_ in BLOCKS)
    assert sum(reason is None for *_, reason in BLOCKS) >= 10


@pytest.mark.parametrize(
    ("page", "line", "code", "reason"),
    BLOCKS,
    ids=[f"{page}:{line}" for page, line, _, _ in BLOCKS],
)
def test_block_runs(
    page: str,
    line: int,
    code: str,
    reason: str | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if reason is not None:
        assert reason.strip(), f"{page}:{line}: a no-run block must say why"
        pytest.skip(f"not run: {reason.strip()}")
    from backends.registry import registry
    from backends.tensorrt.lowering import lowering_passes

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CHAIN_MEMORY", "0")
    monkeypatch.delenv("CHAIN_REPORT", raising=False)
    monkeypatch.delenv("CHAIN_STORE", raising=False)
    torch._dynamo.reset()
    compiled = compile(code, f"{page}:{line}", "exec")
    try:
        with registry.snapshot(), lowering_passes.snapshot():
            exec(compiled, {"__name__": "__docs__"})
    finally:
        torch._dynamo.reset()
