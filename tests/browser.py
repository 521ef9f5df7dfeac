"""Headless Chromium (the distribution's package) for tests: the DOM after load, the
console messages, a screenshot; a reason instead when it cannot start here."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars")


@dataclass(frozen=True)
class Page:
    """What Chromium made of a file: its DOM after scripts ran, and its console lines."""

    dom: str
    console: list[str]


def chromium() -> str | None:
    """The Chromium executable, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    return None


def why_not() -> str | None:
    """None when headless Chromium starts here, else why not (for pytest.skip)."""
    exe = chromium()
    if exe is None:
        return "no chromium here (apt-get install chromium)"
    try:
        done = subprocess.run(
            [exe, *FLAGS, "--dump-dom", "about:blank"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"chromium does not start: {e}"
    if done.returncode != 0 or "<html" not in done.stdout:
        return f"chromium does not start (exit {done.returncode}): {done.stderr[-300:]}"
    return None


def load(path: Path, timeout_s: float = 120) -> Page:
    """Open `path` headless; the DOM it dumps and every `CONSOLE` line it logs."""
    exe = chromium()
    if exe is None:
        raise RuntimeError("no chromium")
    done = subprocess.run(
        [exe, *FLAGS, "--enable-logging=stderr", "--v=0", "--dump-dom", path.resolve().as_uri()],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=True,
    )
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    return Page(done.stdout, console)


def screenshot(path: Path, png: Path, width: int = 1200, height: int = 1400) -> Path:
    """A PNG of `path` rendered at `width` x `height`."""
    exe = chromium()
    if exe is None:
        raise RuntimeError("no chromium")
    subprocess.run(
        [exe, *FLAGS, f"--window-size={width},{height}", f"--screenshot={png.resolve()}",
         path.resolve().as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )  # fmt: skip
    return png
