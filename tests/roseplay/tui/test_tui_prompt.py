"""The prompt box at common terminal sizes: what you type shows, errors show (issue 18)."""
from __future__ import annotations

import pytest
from textual import events

from roseplay.tui.app import RoseplayApp
from roseplay.tui.widgets.help import HelpScreen
from roseplay.workload.own_prompts import own_request_id
from tests.roseplay.tui.helpers import live_source, screen_text, sync, wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("fast_pilot")]


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
@sync
async def test_typed_text_and_errors_are_visible(size):
    src = live_source(paused=True)      # (typing and a refused prompt need no step)
    try:
        app = RoseplayApp(source=src)
        async with app.run_test(size=size) as pilot:
            await _open_prompt(pilot, app)
            await pilot.press(*"hello roseplay")
            assert await wait_for(pilot, lambda: "hello roseplay" in screen_text(app), 30), \
                screen_text(app)
            app.query_one("#prompt-input").value = "y" * 3000     # > 96 blocks x 16 tokens
            await pilot.press("enter")
            assert await wait_for(pilot, lambda: "✗ prompt has 3000 tokens"
                                  in screen_text(app), 5), screen_text(app)
            rows = screen_text(app).splitlines()
            assert len(rows) == size[1]
            assert "esc Close prompt" in rows[-1]      # the footer is still there, below the box
    finally:
        src.close()


@sync
async def test_the_prompt_box_sends_the_priority_typed():
    src = live_source(paused=True)      # (what is sent, and said, needs no step)
    sent = []
    submit = src.loop.submit

    def spy(*args, **kwargs):
        sent.append((kwargs.get("request_id"), kwargs.get("priority")))
        return submit(*args, **kwargs)
    src.loop.submit = spy
    try:
        app = RoseplayApp(source=src)
        async with app.run_test(size=(120, 40)) as pilot:
            await _open_prompt(pilot, app)
            box = app.query_one("#prompt-priority")         # on screen, beside the prompt
            assert box.region.right <= 120 and "priority 0" in screen_text(app)
            await pilot.press(*"to the front", "tab", "minus", "5", "enter")
            assert await wait_for(pilot, lambda: "(priority -5)" in screen_text(app), 90)
            assert (own_request_id(1), -5) in sent
            await pilot.press(*"default", "enter")      # (the focus is back in the prompt)
            assert await wait_for(pilot, lambda: (own_request_id(2), -5) in sent, 30)   # the box keeps it
    finally:
        src.close()


async def _open_prompt(pilot, app) -> None:
    """`i`, then wait until the prompt field has the focus."""
    await pilot.press("i")
    assert await wait_for(pilot, lambda: app.focused is app.query_one("#prompt-input"), 30)


@sync
async def test_two_quick_tabs_reach_the_sampling_field():
    """Tab, Tab typed fast (as a terminal delivers them, no redraw between) move two
    fields: each Tab moves from where the last one left the focus."""
    src = live_source(paused=True)
    try:
        app = RoseplayApp(source=src)
        async with app.run_test(size=(120, 40)) as pilot:
            await _open_prompt(pilot, app)
            app.simulate_key("tab")
            app.simulate_key("tab")           # queued behind the first, as typed
            await pilot.pause()
            await pilot.press(*"seed=3")
            assert app.query_one("#prompt-sampling").value == "seed=3"
            app.simulate_key("shift+tab")
            app.simulate_key("shift+tab")
            app.simulate_key("shift+tab")     # all the way round
            await pilot.pause()
            assert app.focused is app.query_one("#prompt-sampling")
    finally:
        src.close()


@sync
async def test_what_is_typed_right_after_i_is_the_prompts():
    """`i` then `hello` in one burst (fast typing, a paste): the letters fill the prompt;
    none reaches the app's keys (h: preemption_mode, e: eviction_policy, l: the SLO
    dialog), and `i` in the field is a letter. The same for `l` (the SLO dialog); over
    another screen `i` opens nothing."""
    src = live_source(paused=True)
    try:
        app = RoseplayApp(source=src)
        async with app.run_test(size=(120, 40)) as pilot:
            before = src.knobs
            for key in "ihello, i said":     # queued together, none drawn in between
                app.post_message(events.Key(key, key))
            await pilot.pause()
            assert app.query_one("#prompt-input").value == "hello, i said"   # `i` as text
            assert src.knobs == before and len(app.screen_stack) == 1
            await pilot.press("escape")
            for key in "lttft:9":            # the SLO dialog's key, then its text
                app.post_message(events.Key(key, key))
            await pilot.pause()
            assert src.knobs == before and len(app.screen_stack) == 2
            assert app.screen.query_one("#slo-input").value == "ttft:9"
            await pilot.press("escape")      # (a loaded box: the dialog gone before `?`,
            assert await wait_for(pilot, lambda: len(app.screen_stack) == 1)   # which it
            await pilot.press("question_mark")                                 # took)
            assert await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
            await pilot.press("i")           # over the help screen: no prompt opens
            await pilot.pause()
            assert not app.prompt_bar.is_open
    finally:
        src.close()


@sync
async def test_text_typed_after_fast_tabs_lands_in_the_field_they_reach():
    """`ROMEO.`, Tab, Tab, `choice=yes|no` in one burst (fast typing, a paste): the
    sampling field gets the choice whole. The letters after the Tabs went to the prompt
    field while its queue still held the Tabs (`choice=yes|` there, `no` in sampling)."""
    src = live_source(paused=True)
    try:
        app = RoseplayApp(source=src)
        async with app.run_test(size=(120, 40)) as pilot:
            await _open_prompt(pilot, app)
            burst = [*"ROMEO.", "tab", "tab", *"choice=yes", "vertical_line", *"no"]
            for key in burst:                  # queued together, none drawn in between
                app.post_message(events.Key(key, "|" if key == "vertical_line" else
                                            None if key == "tab" else key))
            await pilot.pause()
            assert app.query_one("#prompt-input").value == "ROMEO."
            assert app.query_one("#prompt-sampling").value == "choice=yes|no"
    finally:
        src.close()


def _typed_at_once(app, keys) -> None:
    """Keys that arrive together (fast typing, a paste, a loaded CPU): all in the app's
    queue before the first is handled, as a terminal delivers them (Pilot waits between
    keys, so its presses never overtake each other)."""
    from textual import events
    from textual.keys import _character_to_key
    for key in keys:
        char = key if len(key) == 1 else None
        app.post_message(events.Key(_character_to_key(key) if char else key, char))


@sync
async def test_editing_keys_typed_fast_act_in_their_order(paused_source):
    """`ROMEO` ⌫⌫ `XY` read `ROMEO` (the backspaces ran after the letters behind them),
    and ctrl+u then `top_k=5` then Enter sent an empty sampling field."""
    sent = []
    submit = paused_source.loop.submit

    def spy(prompt, params, **kwargs):
        if kwargs.get("request_id", "").startswith("you-"):     # (not the workload's)
            sent.append(params.top_k)
        return submit(prompt, params, **kwargs)
    paused_source.loop.submit = spy
    app = RoseplayApp(source=paused_source)
    async with app.run_test(size=(120, 40)) as pilot:
        await _open_prompt(pilot, app)
        field = app.query_one("#prompt-input")
        _typed_at_once(app, [*"ROMEO", "backspace", "backspace", *"XY", "left", "Z"])
        assert await wait_for(pilot, lambda: field.value == "ROMXZY", 30), field.value
        await pilot.press("tab", "tab")
        sampling = app.query_one("#prompt-sampling")
        assert await wait_for(pilot, lambda: app.focused is sampling, 30)
        _typed_at_once(app, [*"top_k=9", "ctrl+u", *"top_k=5", "enter"])
        assert await wait_for(pilot, lambda: sent == [5], 30), (sent, sampling.value)
        assert sampling.value == "top_k=5"


@sync
async def test_after_a_prompt_is_sent_the_next_is_typed_in_the_prompt_field(paused_source):
    """Enter in the sampling field sent the prompt and left the focus there: the next
    prompt's words went into the sampling field."""
    app = RoseplayApp(source=paused_source)
    async with app.run_test(size=(120, 40)) as pilot:
        await _open_prompt(pilot, app)
        await pilot.press(*"ROMEO:", "tab", "tab", *"top_k=5", "enter")
        assert await wait_for(pilot, lambda: f"submitted as {own_request_id(1)}" in screen_text(app), 30)
        prompt = app.query_one("#prompt-input")
        assert await wait_for(pilot, lambda: app.focused is prompt, 30)
        await pilot.press(*"JULIET")
        assert prompt.value == "JULIET"
        assert app.query_one("#prompt-sampling").value == "top_k=5"     # kept for the next
