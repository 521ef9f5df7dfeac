"""Exceptions of the backend contract: how a backend says "not this graph" or "try again"."""

from __future__ import annotations

import re

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")  # `<function f at 0x7f...>`: differs every run


def without_addresses(text: str) -> str:
    """`text` with Python's ` at 0x7f...` object addresses removed: `<function f>`, so that
    a reason reads the same in every run and two reports can be compared line by line."""
    return _ADDRESS.sub("", text)


class Unsupported(Exception):
    """This backend cannot take this graph (unsupported op, dynamic shapes, training graph).

    `reason` is one readable line for the report; `detail` holds the full text
    (an exporter's log, a parser's node-by-node errors) for the JSON.
    """

    def __init__(self, reason: str, detail: str | None = None) -> None:
        reason = without_addresses(str(reason))
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


class Transient(Exception):
    """A failure worth retrying as is (a busy device, a flaky build); the chain retries it."""


class BackendExit(RuntimeError):
    """A backend raised SystemExit: a failure of that backend, never the end of the process."""

    def __init__(self, exc: SystemExit) -> None:
        super().__init__(f"the backend raised SystemExit({exc.code!r})")


class InvalidBackend(ValueError):
    """A backend name that resolves nowhere; the message lists the valid names."""


class InvalidOption(ValueError):
    """An option a backend does not accept; the message lists the ones it does."""


def raised_at(error: BaseException) -> str | None:
    """`file.py:line in function` of the frame that raised `error` (the innermost), with the
    path cut to its last two parts; None without a traceback."""
    tb = error.__traceback__
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    path = "/".join(code.co_filename.replace("\\", "/").split("/")[-2:])
    return f"{path}:{tb.tb_lineno} in {code.co_name}"


def one_line(error: BaseException, limit: int = 240, message: str | None = None) -> str:
    """`Type: first line of the message`, trimmed to `limit`: what a report row can hold.

    `message`: the line to show instead of the message's first one (a caller's cleaned-up
    text); it is not prefixed again when it already starts with `Type:`. Object addresses
    (` at 0x7f...`) are dropped (`without_addresses`).
    """
    if message is None:
        text = str(error).strip().splitlines()
        message = text[0] if text else ""
    message = without_addresses(message)
    kind = type(error).__name__
    line = message if message.startswith(f"{kind}:") else f"{kind}: {message}" if message else kind
    if not message and (where := raised_at(error)):
        line = f"{kind} ({where})"  # a bare `assert`: where it failed is all there is to say
    return line if len(line) <= limit else line[: limit - 3] + "..."
