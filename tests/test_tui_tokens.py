"""The token choice on screen (issue 33): the speculation knob's keys, speculation's
counts in the panels, the next-token distribution of the selected request."""
from __future__ import annotations

import pytest

from roseplay.app import RoseplayApp
from roseplay.keys import KEYS, knob_key
from roseplay.widgets.help import keys_markdown, knobs_markdown
from tui_helpers import fast_idle, live_source, widget_text, sync, wait_for

pytestmark = pytest.mark.timeout(150)


@pytest.fixture(autouse=True)
def _fast_idle(monkeypatch):
    fast_idle(monkeypatch)


def test_every_key_is_bound_once_and_each_knob_key_is_defined_in_keys():
    names = [n for k in KEYS for n in k.keys.split(",")]
    assert len(names) == len(set(names)), "a key is bound twice"
    assert knob_key("num_speculative_tokens") == "D/d"
    assert knob_key("max_num_batched_tokens") == "-/+" and knob_key("max_num_seqs") == "[/]"
    assert knob_key("enable_prefix_caching") == "c" and knob_key("scheduling_mode") == "m"
    assert "`d`" in keys_markdown("live") and "num_speculative_tokens" in keys_markdown("live")
    assert "`D/d` **num_speculative_tokens**" in knobs_markdown()
    assert "`d`" not in keys_markdown("replay")          # a live knob: hidden in a replay


@sync
async def test_d_and_D_turn_speculation_on_and_off_on_the_engine_process():
    src = live_source(in_process=False, scenario="identical")
    try:
        app = RoseplayApp(source=src)
        async with app.run_test(size=(160, 48)) as pilot:
            assert await wait_for(pilot, lambda: app.snapshot is not None, 60)
            knobs = app.query_one("KnobsPanel")
            assert await wait_for(pilot, lambda: "OFF" in widget_text(knobs)
                                  and "D/d" in widget_text(knobs), 10)
            for _ in range(7):              # clamped at the top: 5
                await pilot.press("d")
            assert src.knobs.num_speculative_tokens == 5
            assert await wait_for(pilot, lambda: app.snapshot.knobs.num_speculative_tokens
                                  == 5, 30), "the engine never applied k=5"
            assert await wait_for(pilot, lambda: "5 drafts" in widget_text(knobs), 5)
            assert "num_speculative_tokens:" in widget_text(knobs)     # its help text
            await pilot.press(*"D" * 6)      # clamped at 0: off
            assert await wait_for(pilot, lambda: app.snapshot.knobs.num_speculative_tokens
                                  == 0, 30)
            assert src.knobs.num_speculative_tokens == 0
    finally:
        src.close()
