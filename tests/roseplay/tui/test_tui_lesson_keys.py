"""Issue 22's key defects, each as a user meets it on a live dummy engine: the prompt box
keeps its keys, the palette's budget obeys the `+` cap, the palette lists roseplay's own
commands only."""
from __future__ import annotations

import pytest

from roseplay.tui.app import RoseplayApp
from roseplay.tui.widgets.prompt_input import PromptBar
from tests.roseplay.tui.helpers import (notices, palette_query, screen_text, sync,
                                        wait_for)

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("fast_pilot")]


def _knobs(source) -> tuple:
    k = source.knobs
    return (k.eviction_policy, k.scheduling_mode, k.scheduling_policy,
            k.max_num_batched_tokens, k.enable_prefix_caching, source.workload()["rate"])


@sync
async def test_tab_cycles_the_prompt_box_and_letters_never_turn_knobs(paused_source):
    """`i`, ROMEO:, Tab x3, `e` used to flip eviction to lfu with the box still drawn;
    after a stray Tab, `temperature=0` fired t, e, m, p, r, =, 0."""
    source = paused_source        # (keys and focus need no step: the engine stays paused)
    app = RoseplayApp(source=source)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("i")
        bar = app.query_one(PromptBar)
        fields = [app.query_one(f) for f in PromptBar.FIELDS]
        assert await wait_for(pilot, lambda: app.focused is fields[0], 30)
        before = _knobs(source)
        await pilot.press(*"ROMEO:")
        for expected in (1, 2, 0):              # Tab walks the three fields and wraps
            await pilot.press("tab")
            assert await wait_for(pilot, lambda: app.focused is fields[expected], 30)
        await pilot.press("e")
        await pilot.press("shift+tab")          # back to the sampling field
        assert await wait_for(pilot, lambda: app.focused is fields[2], 30)
        for expected in (0, 1, 2):
            await pilot.press("tab")
            assert await wait_for(pilot, lambda: app.focused is fields[expected], 30)
        await pilot.press(*"temperature=0")
        await pilot.pause(0.3)
        assert bar.is_open and _knobs(source) == before
        assert fields[0].value == "ROMEO:e"       # the `e` was typed, not a key
        assert fields[2].value == "temperature=0"
        assert not app.timing.history._pending      # no knob mark on the plots either


@sync
async def test_a_click_outside_the_prompt_box_closes_it(paused_source):
    source = paused_source        # (no step needed: the engine stays paused)
    app = RoseplayApp(source=source)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("i")
        bar = app.query_one(PromptBar)
        assert await wait_for(pilot, lambda: app.focused is app.query_one("#prompt-input"), 30)
        await pilot.press(*"ROMEO:")
        await pilot.click("#requests")
        assert await wait_for(pilot, lambda: not bar.is_open, 30)
        before = _knobs(source)
        await pilot.press("i")                   # the typed text is still there
        assert await wait_for(pilot, lambda: bar.is_open, 30)
        assert app.query_one("#prompt-input").value == "ROMEO:"
        assert _knobs(source) == before


@sync
async def test_the_palette_budget_obeys_the_cap_that_plus_stops_at(paused_source):
    """`budget 100000` used to pass the cap `+` enforces (the pool's tokens); `+` from a
    budget above the cap then lowered it."""
    source = paused_source        # (no step needed: the engine stays paused)
    app = RoseplayApp(source=source)
    cap = source.info.num_blocks * source.info.block_size
    async with app.run_test(size=(120, 40)) as pilot:
        await palette_query(pilot, app, "budget 100000")
        assert await wait_for(pilot, lambda: "max_num_batched_tokens = 100000"
                              in screen_text(app), 30)
        await pilot.press("enter")
        assert await wait_for(pilot, lambda: f"at most {cap}" in notices(app), 30), notices(app)
        assert source.knobs.max_num_batched_tokens == 512
        await palette_query(pilot, app, f"budget {cap}")
        assert await wait_for(pilot, lambda: f"max_num_batched_tokens = {cap}"
                              in screen_text(app), 30)
        await pilot.press("enter")
        assert await wait_for(pilot, lambda: source.knobs.max_num_batched_tokens == cap, 30)
        source.set_knobs(max_num_batched_tokens=4 * cap)     # as --max-num-batched-tokens may
        await pilot.press("plus")
        assert await wait_for(pilot, lambda: "at its cap" in notices(app), 30)
        assert source.knobs.max_num_batched_tokens == 4 * cap     # `+` never lowers it


@sync
async def test_the_palette_lists_roseplays_commands_only(paused_source):
    """Textual's own commands came first, among them a second "Theme" (Textual's theme
    picker) unrelated to the `t` key."""
    source = paused_source        # (no step needed: the engine stays paused)
    app = RoseplayApp(source=source)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("ctrl+p")
        assert await wait_for(pilot, lambda: "resume the engine" in screen_text(app), 30)
        from textual.command import CommandList
        options = app.screen.query_one(CommandList)
        count = -1
        while count != options.option_count:        # every provider has answered
            count = options.option_count
            await pilot.pause(0.5)
        prompts = [str(options.get_option_at_index(i).prompt) for i in range(count)]
        for textual_own in ("Change the current theme", "Quit the application",
                            "Save an SVG", "Show help for the focused widget"):
            assert not any(textual_own in p for p in prompts), prompts
        assert prompts[0].startswith("resume the engine"), prompts[:3]   # paused: not "pause"
        assert not any(p.startswith("pause the engine") for p in prompts), prompts[:3]


@sync
async def test_the_slo_editor_says_good_in_italics_not_asterisks(paused_source):
    source = paused_source        # (no step needed: the engine stays paused)
    from roseplay.tui.widgets.slo_input import SloScreen
    app = RoseplayApp(source=source)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("l")
        assert await wait_for(pilot, lambda: isinstance(app.screen, SloScreen), 30)
        await pilot.pause(0.2)
        text = screen_text(app)
        assert "a request is good when it meets all" in text and "*good*" not in text
