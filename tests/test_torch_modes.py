"""torch.compile's `mode=` honoured by backend="chain", checked, and refused where a chain
object was built otherwise (chain.select.torch_modes)."""

from __future__ import annotations

import pytest
import torch

from backends.errors import InvalidOption
from chain import chain, last_chain
from chain.select import torch_modes
from tests.models import build


def _first_call(backend: object, **compile_kwargs: object) -> None:
    model, args = build("mlp")
    with torch.no_grad():
        compiled = torch.compile(model, backend=backend, **compile_kwargs)
        torch.testing.assert_close(compiled(*args), model(*args))


@pytest.mark.parametrize(
    ("mode", "chain_mode", "cuda_graphs"),
    [("fastest", "fastest", "auto"), ("max-autotune", "fastest", "auto"),
     ("reduce-overhead", "first", True)],
)  # fmt: skip
def test_torch_compile_mode_reaches_the_chain(
    mode: str, chain_mode: str, cuda_graphs: object
) -> None:
    _first_call("chain", mode=mode)
    used = last_chain()
    assert used is not None
    assert (used.mode, used.graphs.setting) == (chain_mode, cuda_graphs)
    if chain_mode == "fastest":  # every available backend was tried: none left untried
        statuses = {a.status.value for a in used.report.graphs[-1].attempts}
        assert "not_tried" not in statuses


def test_torch_compile_default_mode_is_the_chains_default() -> None:
    _first_call("chain", mode="default")
    used = last_chain()
    assert used is not None
    assert (used.mode, used.graphs.setting) == ("first", "auto")


def test_torch_compile_unknown_mode_names_the_choices() -> None:
    with pytest.raises(Exception, match="did you mean 'fastest'") as caught:
        _first_call("chain", mode="fastset")
    for valid in torch_modes.TORCH_MODES:
        assert repr(valid) in str(caught.value)


def test_mode_table_maps_torch_modes() -> None:
    assert torch_modes.options_for("max-autotune") == {"mode": "fastest"}
    assert torch_modes.options_for("reduce-overhead") == {"cuda_graphs": True}
    assert torch_modes.options_for(None) == {} == torch_modes.options_for("default")
    with pytest.raises(InvalidOption, match="valid: 'default', 'first', 'fastest'"):
        torch_modes.options_for(3)
    with pytest.raises(InvalidOption, match="sets mode='fastest' but options say mode='first'"):
        torch_modes.merged("fastest", {"mode": "first"})


def test_a_chain_object_refuses_a_mode_it_was_not_built_with() -> None:
    backend = chain("eager", measure=False)
    with pytest.raises(Exception, match=r"build it with chain\(\.\.\., mode='fastest'\)"):
        _first_call(backend, mode="max-autotune")
    torch._dynamo.reset()
    _first_call(backend, mode="first")  # agrees with the chain: accepted
    assert backend.report.graphs[-1].winner == "eager"


def test_a_chain_object_refuses_torch_compile_options() -> None:
    with pytest.raises(Exception, match=r"give them to chain\(\.\.\.\)"):
        _first_call(chain("eager", measure=False), options={"mode": "fastest"})
