"""A recorded reason says something even when the error's message is empty."""

from __future__ import annotations

from backends.errors import one_line, raised_at


def _bare_assert() -> None:
    raise AssertionError  # what a bare `assert` raises (pytest rewrites this file's asserts)


def test_a_bare_assert_says_where_it_failed() -> None:
    try:
        _bare_assert()
    except AssertionError as error:
        line = one_line(error)
    assert line.startswith("AssertionError (tests/test_errors_reasons.py:")
    assert line.endswith("in _bare_assert)")


def test_a_message_is_kept_and_no_traceback_means_no_place() -> None:
    assert one_line(ValueError("bad shape")) == "ValueError: bad shape"
    assert one_line(AssertionError()) == "AssertionError"
    assert raised_at(AssertionError()) is None


def test_a_backend_failing_a_bare_assert_is_recorded_with_its_place() -> None:
    """Seen on a GPU: torch's cudagraph trees failed a bare assert and the report said only
    `AssertionError`; the attempt's reason now says where."""
    import torch

    from chain import Status, chain

    def broken(gm: object, inputs: object) -> None:
        _bare_assert()

    backend = chain(broken, "eager", memory=False)
    model = torch.nn.Linear(4, 4).eval()
    x = torch.randn(2, 4)
    with torch.inference_mode():
        out = torch.compile(model, backend=backend)(x)
        torch.testing.assert_close(out, model(x))
    [graph] = backend.report.graphs
    failed = graph.attempts[0]
    assert failed.status is Status.COMPILE_ERROR
    assert failed.reason.startswith("AssertionError (tests/test_errors_reasons.py:"), failed.reason
    assert failed.reason.endswith("in _bare_assert)")
