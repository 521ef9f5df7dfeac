"""Exceptions of the backend contract: how a backend says "not this graph" or "try again"."""

from __future__ import annotations


class Unsupported(Exception):
    """This backend cannot take this graph (unsupported op, dynamic shapes, training graph).

    `reason` is one readable line for the report; `detail` holds the full text
    (an exporter's log, a parser's node-by-node errors) for the JSON.
    """

    def __init__(self, reason: str, detail: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


class Transient(Exception):
    """A failure worth retrying as is (a busy device, a flaky build); the chain retries it."""


class InvalidBackend(ValueError):
    """A backend name that resolves nowhere; the message lists the valid names."""


class InvalidOption(ValueError):
    """An option a backend does not accept; the message lists the ones it does."""
