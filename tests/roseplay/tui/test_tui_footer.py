"""The footer names what each key it shows does now: space reads Resume while paused,
however the pause came (space, `n`, a replay), and where a field has the focus the help
key it shows is one the field leaves to the app; a key of the other mode (live, replay)
says where it acts instead of doing nothing unsaid."""
from __future__ import annotations

import pytest

from roseplay.tui.app import RoseplayApp
from roseplay.tui.widgets.help import HelpScreen
from roseplay.tui.widgets.prompt_input import PromptBar
from tests.roseplay.tui.helpers import (StaticSource, notices, screen_text, session_snapshot,
                                        sync, wait_for)

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("fast_pilot")]


def footer(app) -> str:
    return screen_text(app).splitlines()[-1]


@sync
async def test_space_reads_resume_while_paused_and_pause_while_serving(paused_source):
    """It read `space Pause` while paused (the key resumed)."""
    source = paused_source
    app = RoseplayApp(source=source)
    async with app.run_test(size=(120, 40)) as pilot:
        assert await wait_for(pilot, lambda: "space Resume" in footer(app), 30), footer(app)
        assert "Pause" not in footer(app)
        await pilot.press("space")
        assert await wait_for(pilot, lambda: not source.paused, 30)
        assert await wait_for(pilot, lambda: "space Pause" in footer(app), 30), footer(app)
        assert "Resume" not in footer(app)
        await pilot.press("n")          # a step pauses: the footer follows without space
        assert await wait_for(pilot, lambda: source.paused, 30)
        assert await wait_for(pilot, lambda: "space Resume" in footer(app), 30), footer(app)
        await pilot.press("space")
        assert await wait_for(pilot, lambda: not source.paused, 30)
        await pilot.press("space")
        assert await wait_for(pilot, lambda: source.paused, 30)


@sync
async def test_a_paused_replay_reads_resume():
    app = RoseplayApp(source=StaticSource(session_snapshot()))
    async with app.run_test(size=(120, 40)) as pilot:
        assert await wait_for(pilot, lambda: "space Resume" in footer(app), 30), footer(app)


@sync
async def test_with_the_prompt_focused_the_footer_shows_f1_which_opens_the_help(
        paused_source):
    """It showed `? Help` while `?` typed a question mark into the prompt."""
    app = RoseplayApp(source=paused_source)
    async with app.run_test(size=(120, 40)) as pilot:
        assert await wait_for(pilot, lambda: "? Help" in footer(app), 30), footer(app)
        await pilot.press("i")
        field = app.query_one("#prompt-input")
        assert await wait_for(pilot, lambda: app.focused is field, 30)
        await pilot.press("question_mark")
        assert await wait_for(pilot, lambda: field.value == "?", 30)
        assert await wait_for(pilot, lambda: "f1 Help" in footer(app), 30), footer(app)
        assert "? Help" not in footer(app)
        await pilot.press("f1")
        assert await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), 30)
        assert app.query_one(PromptBar).is_open


@sync
async def test_a_live_key_in_a_replay_says_where_it_acts():
    """`c`, `+`, `i` in a replay did nothing and said nothing, while the Knobs panel
    listed them beside the knobs."""
    app = RoseplayApp(source=StaticSource(session_snapshot()))
    async with app.run_test(size=(120, 40)) as pilot:
        for key, display in (("c", "c"), ("plus", "+"), ("i", "i")):
            await pilot.press(key)
            assert await wait_for(pilot, lambda: notices(app).splitlines()[-1].startswith(
                f"{display} acts on a live engine only ("), 30), notices(app)
        await pilot.press("o")                  # a key of both modes: no such note
        await pilot.pause()
        assert not notices(app).splitlines()[-1].startswith("o ")


@sync
async def test_a_replay_key_on_a_live_engine_says_where_it_acts(paused_source):
    app = RoseplayApp(source=paused_source)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("b")
        assert await wait_for(pilot, lambda: "b acts in a replay only" in notices(app), 30)
        await pilot.press("i")                  # typed into the prompt: no note
        field = app.query_one("#prompt-input")
        assert await wait_for(pilot, lambda: app.focused is field, 30)
        await pilot.press("g")
        assert await wait_for(pilot, lambda: field.value == "g", 30)
        assert "g acts" not in notices(app)


@sync
async def test_a_key_the_compare_view_lacks_says_so():
    """`z` and `o` (zoom, sort: no request list or zoom there) did nothing unsaid."""
    from roseplay.tui.compare import CompareReplaySource
    from roseplay.tui.compare_app import CompareApp
    from tests.roseplay.tui.helpers import DATA
    app = CompareApp(source=CompareReplaySource(f"{DATA}/compare_session.jsonl.gz",
                                                start_paused=True))
    async with app.run_test(size=(120, 40)) as pilot:
        for key in ("z", "o"):
            await pilot.press(key)
            assert await wait_for(pilot, lambda: notices(app).splitlines()[-1].startswith(
                f"{key} ("), 30), notices(app)
            assert "not in the compare view" in notices(app).splitlines()[-1]
        await pilot.press("c")                  # a live key in this replay: the replay's note
        assert await wait_for(pilot, lambda: "c acts on a live engine only" in notices(app), 30)


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 60)], ids=lambda s: f"{s[0]}x{s[1]}")
@sync
async def test_with_the_prompt_open_the_message_line_offers_no_key_that_types(
        paused_source, size):
    """At 120x40 it read `hidden at 120×40: Steps · z zooms a panel · ? help` above a
    footer reading `f1 Help`, and both z and ? typed into the prompt."""
    app = RoseplayApp(source=paused_source)
    async with app.run_test(size=size) as pilot:
        await pilot.press("i")
        field = app.query_one("#prompt-input")
        assert await wait_for(pilot, lambda: app.focused is field, 30)
        line = lambda: screen_text(app).splitlines()[-2]        # noqa: E731
        assert await wait_for(pilot, lambda: "Esc" in line() or "hidden" in line(), 30)
        assert "? help" not in line() and "· z zooms" not in line(), line()
        assert not line().rstrip().endswith("…"), line()
        if "hidden" not in line():
            assert "f1 help" in line(), line()
        elif size != (80, 24):          # (there the hidden panels take the line)
            assert "Esc, then z zooms a panel" in line(), line()
        await pilot.press("escape")
        assert await wait_for(pilot, lambda: "Esc" not in line(), 30), line()
        assert "? help" in line() or size == (80, 24), line()
