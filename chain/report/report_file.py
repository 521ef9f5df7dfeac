"""The chain's live report file (`report_path` / `$CHAIN_REPORT`): one file per chain, and a
write that fails is a warning, never an exception from the model call.

Several chains in one process given the same path (two `torch.compile` calls under one
`CHAIN_REPORT`) each keep their graphs: the first chain to write claims the path as given,
each later one `<stem>.2<suffix>`, `<stem>.3<suffix>`, ... (an info line on the `chain`
logger names it). A claim ends when its chain is collected, so a chain built again (a
notebook cell run twice) writes the given path again. Processes do not see each other's
claims: give each its own path (`CHAIN_REPORT=run.$RANK.json`).

The file is written through the file layer (backends.common.files): only a regular file is
replaced; a symlink, FIFO, device or folder at the path is refused with that warning and
left as it was (issue 32: a FIFO or /dev/null was once turned into a regular file).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from pathlib import Path

from chain.report.report import Report

log = logging.getLogger("chain")

_claims: set[Path] = set()
_lock = threading.Lock()


def _numbered(path: Path, n: int) -> Path:
    return path if n == 1 else path.with_name(f"{path.stem}.{n}{path.suffix}")


def claim(path: str | os.PathLike[str]) -> Path:
    """The first of `path`, `<stem>.2<suffix>`, ... that no live chain of this process holds."""
    wanted = Path(os.path.abspath(path))
    with _lock:
        n = 1
        while _numbered(wanted, n) in _claims:
            n += 1
        _claims.add(_numbered(wanted, n))
        return _numbered(wanted, n)


def _release(path: Path) -> None:
    with _lock:
        _claims.discard(path)


class ReportFile:
    """Where one chain rewrites its report after every graph (claimed at the first write)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.requested = Path(path)
        self.path: Path | None = None  # the claimed file, once written to
        self._warned: set[str] = set()

    def write(self, report: Report) -> Path | None:
        """Save `report`; on any failure log a warning (once per distinct error) and go on."""
        if self.path is None:
            self.path = claim(self.requested)
            weakref.finalize(self, _release, self.path)
            if self.path != Path(os.path.abspath(self.requested)):
                log.info(
                    "report: %s is another chain's; this chain writes %s",
                    self.requested,
                    self.path,
                )
        try:
            return report.save(self.path)
        except Exception as e:  # a report must never fail the model call: warn instead
            message = f"{type(e).__name__}: {e}"
            if message not in self._warned:
                self._warned.add(message)
                log.warning(
                    "report not written to %s (%s); the model runs on: set report_path or "
                    "CHAIN_REPORT to a writable regular file",
                    self.path,
                    message,
                )
            return None
