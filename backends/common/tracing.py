"""Whether a backend may trace a graph now, at run time (ONNX Runtime's re-export after a
frozen weight changed): a trace patches `nn.Module.__call__` and sets torch.fx's tracing
flag process-wide, and other threads' calls of compiled models meanwhile raise.

Which threads call is the caller's knowledge, not a backend's: the program that runs the
backends installs its rule (`set_rule`; backend-chain's is `chain.run.callers.may_trace`).
Without one, tracing is allowed, as torch itself allows it.
"""

from __future__ import annotations

from collections.abc import Callable


def _always() -> bool:
    return True


_rule: list[Callable[[], bool]] = [_always]


def may_trace() -> bool:
    """True where a trace on this thread cannot disturb other threads' calls."""
    return _rule[0]()


def set_rule(rule: Callable[[], bool]) -> None:
    """Install the rule `may_trace` answers by."""
    _rule[0] = rule
