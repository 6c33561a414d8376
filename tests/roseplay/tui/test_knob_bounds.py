"""The keys' bounds of the integer knobs are engine/config.py's (one home per fact): the
minimum in a field's metadata, the maximum in KNOB_MAXIMUM and MAX_SPECULATIVE_TOKENS,
none repeated in the TUI."""
from __future__ import annotations

import pytest

from engine.config import KNOB_MAXIMUM, MAX_SPECULATIVE_TOKENS, make_config
from engine.errors import InvalidRequestError
from roseplay.tui.keys import KEYS
from roseplay.tui.widgets.knobs import knob_bounds, knob_field, stepped


def test_speculations_bounds_are_the_engines():
    assert knob_bounds("num_speculative_tokens") == (
        knob_field("num_speculative_tokens").metadata["minimum"], MAX_SPECULATIVE_TOKENS)
    make_config(model="dummy:tiny", num_speculative_tokens=MAX_SPECULATIVE_TOKENS)
    with pytest.raises(InvalidRequestError):
        make_config(model="dummy:tiny", num_speculative_tokens=MAX_SPECULATIVE_TOKENS + 1)
    help_of_d = next(k.help for k in KEYS if k.keys == "d")
    assert f"up to {MAX_SPECULATIVE_TOKENS}" in help_of_d


@pytest.mark.parametrize("name", sorted(KNOB_MAXIMUM))
def test_a_key_at_a_knobs_maximum_stays_there(name):
    """The value the key sends is one the engine takes: at the maximum, `+` keeps it."""
    top = KNOB_MAXIMUM[name]
    assert knob_bounds(name)[1] == top
    assert stepped(top, name, +1) == top
    assert stepped(top - 1, name, +1) == top
    make_config(model="dummy:tiny", **{name: stepped(top, name, +1)})


def test_a_smaller_cap_still_binds():
    assert stepped(1024, "max_num_batched_tokens", +1, 1536) == 1536
