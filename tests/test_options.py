"""Options are checked at chain() time: names, values, types, with the valid choices and hints."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch

import backends
from backends.errors import InvalidBackend, InvalidOption
from backends.options import integer, one_of
from chain import Chain, chain
from chain.judge import verify
from chain.select.options import CHAIN_OPTIONS
from tests import faults
from tests.helpers import compile_and_check
from tests.models import build


@pytest.mark.parametrize(
    ("kwargs", "needles"),
    [
        (
            {"options": {"inductor": {"max_autotun": True}}},
            [
                "backend 'inductor' does not accept option 'max_autotun'",
                "did you mean 'max_autotune'",
            ],
        ),
        (
            {"options": {"inductor": {"max_autotune": "yes"}}},
            ["max_autotune='yes'", "expected True or False"],
        ),
        (
            {"options": {"onnxruntime": {"graph_optimization_level": "everything"}}},
            ["graph_optimization_level='everything'", "'disable', 'basic', 'extended', 'all'"],
        ),
        (
            {"options": {"onnxruntime": {"graph_optimization_level": "al"}}},
            ["did you mean 'all'"],
        ),
        (
            {"options": {"onnxruntime": {"providrs": []}}},
            ["did you mean 'providers'", "valid: allow_spinning, graph_optimization_level"],
        ),
        (
            {"options": {"onnxruntime": {"intra_op_num_threads": 0}}},
            ["intra_op_num_threads=0", "None or an int >= 1"],
        ),
        (
            {"options": {"inductor": True}},
            ["options['inductor'] is a bool, not a dict of inductor's options"],
        ),
        ({"options": {"inductr": {}}}, ["did you mean 'inductor'", "valid keys: inductor"]),
        ({"min_speedup": "1.2"}, ["min_speedup='1.2' (str)", "a number > 0"]),
        ({"max_retries": -1}, ["max_retries=-1", "an int >= 0"]),
        ({"max_retries": 1.5}, ["max_retries=1.5", "an int >= 0"]),
        ({"measure_budget_s": -1}, ["measure_budget_s=-1", "a number >= 0"]),
        ({"compile_timeout_s": 0}, ["compile_timeout_s=0", "None or a number > 0"]),
        ({"compile_timeout_s": -5.0}, ["compile_timeout_s=-5.0"]),
        ({"verify": "no"}, ["verify='no'", "True or False"]),
        ({"mode": "fastes"}, ["'first', 'fastest'", "did you mean 'fastest'"]),
        ({"mdoe": "first"}, ["does not accept option 'mdoe' (did you mean 'mode'?)"]),
        ({"tolerances": {"flaot32": (1e-3, 1e-3)}}, ["'flaot32'", "did you mean 'float32'"]),
        ({"tolerances": {torch.float32: 1e-3}}, ["(rtol, atol) pairs", "0.001"]),
        ({"tolerances": [(1e-3, 1e-3)]}, ["a dict {dtype: (rtol, atol)}"]),
        ({"tolerances": {"float32": (1e3, 1e-3)}}, ["rtol from 0 to 1", "(1000.0, 0.001)"]),
        ({"tolerances": {"float32": (1e-3, 1e9)}}, ["atol from 0 to 1e+06"]),
        ({"report_path": ""}, ["report_path=''", "a non-empty path"]),
        ({"store": ""}, ["store=''", "a directory or a redis://host:port/db URL"]),
        ({"reverify_rate": 1.5}, ["reverify_rate=1.5", "a number >= 0 and <= 1"]),
        ({"reverify_rate": float("nan")}, ["reverify_rate=nan", "a number >= 0 and <= 1"]),
        ({"options": {"onnxruntime": {"intra_op_num_threads": 10**6}}}, ["x the", "cores"]),
        ({"options": {"inductor": {"compile_threads": 10**6}}}, ["compile_threads=1000000"]),
    ],
)
def test_bad_options_fail_at_chain_time_with_what_is_valid(
    kwargs: dict[str, Any], needles: list[str]
) -> None:
    with pytest.raises(InvalidOption) as info:
        chain("inductor", "onnxruntime", "eager", **kwargs)
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message


def test_good_options_pass_and_inductor_takes_nested_config_names() -> None:
    c = chain(
        "inductor",
        "onnxruntime",
        options={
            "inductor": {"max_autotune": False, "triton.cudagraphs": False},
            "onnxruntime": {"graph_optimization_level": "basic", "intra_op_num_threads": None},
        },
        min_speedup=1,
        compile_timeout_s=0.5,
        max_retries=0,
        measure_budget_s=0,
    )
    assert c.options["inductor"] == {"max_autotune": False, "triton.cudagraphs": False}
    assert (c.min_speedup, c.compile_timeout_s, c.max_retries) == (1, 0.5, 0)


def test_tolerances_by_dtype_name_are_applied_not_ignored() -> None:
    """`{"float32": ...}` means torch.float32: a wide atol lets an off-by-one output pass.

    Tolerances judge only graphs without a float64 reference, so they are checked on the
    verifier the chain hands them to.
    """
    c = chain(faults.wrong_numbers, "eager", tolerances={"float32": (0.0, 2.0)}, measure=False)
    assert c.tolerances == {torch.float32: (0.0, 2.0)}
    assert chain("eager", tolerances={"torch.float16": (1, 1)}).tolerances == {
        torch.float16: (1.0, 1.0)
    }
    x = torch.randn(8)
    assert verify.compare(x, x + 1, tolerances=c.tolerances).reason is None
    assert verify.compare(x, x + 1).reason is not None


def test_every_chain_option_has_a_check() -> None:
    """A new keyword of Chain.__init__ needs its entry in chain.options.CHAIN_OPTIONS."""
    params = inspect.signature(Chain.__init__).parameters
    keywords = {n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert keywords == set(CHAIN_OPTIONS)


def test_backend_declares_value_checks_through_the_registry() -> None:
    seen: list[dict[str, Any]] = []
    with backends.registry.snapshot() as reg:

        @reg.register("probe", options={"level": integer(low=0, high=3), "style": one_of("a", "b")})
        def probe(gm: torch.fx.GraphModule, example_inputs: list[Any], **opts: Any) -> Any:
            seen.append(opts)
            return gm.forward

        with pytest.raises(InvalidOption, match=r"probe' option level=7 \(int\): expected an int"):
            chain("probe", options={"probe": {"level": 7}})
        with pytest.raises(InvalidOption, match=r"did you mean 'style'"):
            chain("probe", options={"probe": {"styel": "a"}})
        model, args = build("mlp")
        compile_and_check(model, args, chain("probe", options={"probe": {"level": 2}}))
    assert seen == [{"level": 2}]


def test_unknown_backend_names_a_near_miss_and_hides_testing_only_backends() -> None:
    with pytest.raises(InvalidBackend) as info:
        chain("onnxrutime")
    message = str(info.value)
    assert "unknown backend 'onnxrutime' (did you mean 'onnxruntime'?)" in message
    assert "aot_eager" in message and "TESTING_ONLY" not in message
    with pytest.raises(InvalidBackend):
        chain("relu_compile_error_TESTING_ONLY")
