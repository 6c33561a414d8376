"""The grammar's mask on screen (docs/STRUCTURED_OUTPUTS.md "Shown live"): a prompt typed
with `json=SCHEMA` in the prompt box's sampling field is constrained; the request list
marks it with "{", and the Selected panel shows, each step, how many tokens the grammar
allowed (the engine's count), its state in words, the token taken and the model's top
choices with the ones the mask struck out."""
from __future__ import annotations

import dataclasses
import json

import pytest

from engine.config import InvalidRequestError
from engine.snapshot import GrammarView
from roseplay.tui.app import RoseplayApp
from roseplay.workload.own_prompts import own_request_id
from roseplay.workload.record import Recorder
from roseplay.workload.replay import Recording
from roseplay.tui.widgets.grammar_line import NO_VIEW, grammar_text
from roseplay.tui.widgets.prompt_input import parse_sampling
from roseplay.tui.widgets.requests import RequestList
from tests.roseplay.tui.helpers import (live_source, session_snapshot, settle,
                                        sync, wait_for, widget_text)

pytestmark = [pytest.mark.timeout(150), pytest.mark.usefixtures("fast_pilot")]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}},
          "required": ["name"], "additionalProperties": False}


def test_the_prompt_box_takes_a_constraint():
    schema = json.dumps(SCHEMA, separators=(",", ":"))
    assert parse_sampling(f"temperature=0 json={schema}") == \
        {"temperature": 0.0, "structured_outputs": {"json": schema}}
    assert parse_sampling("json")["structured_outputs"] == {"json_object": True}
    assert parse_sampling("choice=aye|nay")["structured_outputs"] == {"choice": ["aye", "nay"]}
    assert parse_sampling("regex=[0-9]+")["structured_outputs"] == {"regex": "[0-9]+"}
    with pytest.raises(InvalidRequestError, match="json, regex, choice"):
        parse_sampling("jsonn")


def test_the_grammar_lines():
    """Two rows: the mask's count and state, then the model's top with ✓/✗; one row:
    both on a line, cut at a whole choice; compiling and untraced requests say so."""
    g = GrammarView("json", "in string", 3811, 4096, ((5, -0.2, False), (9, -1.9, True)), 9)
    two = grammar_text(g, None, 2).plain.splitlines()
    assert two == ["grammar json · in string · 3,811/4,096 allowed (93%) · took #9",
                   "model's top: #5 82% ✗  #9 15% ✓"]
    one = grammar_text(g, None, 1, width=92).plain
    assert one.startswith(two[0] + " · model's top: #5 82% ✗") and one.endswith("…")
    assert "compiling" in grammar_text(GrammarView("regex", "compiling"), None, 1).plain
    assert NO_VIEW in grammar_text(GrammarView("choice"), None, 1).plain


def test_a_recording_keeps_no_grammar_view(tmp_path):
    """A snapshot with a constrained request records and replays (without its grammar:
    recordings hold no mask), and recordings made before the grammar counters read."""
    base = session_snapshot(12)       # (a recording without the grammar counters)
    view = dataclasses.replace(next(r for r in base.requests if r.state == "decoding"),
                               grammar=GrammarView("json", "in string", 5, 512))
    snap = dataclasses.replace(base, requests=(view,))
    path = str(tmp_path / "g.jsonl.gz")
    rec = Recorder(path, lambda: snap, lambda: {}, interval=3600)
    rec.capture()
    rec.close()
    back = Recording(path)[0].snapshot
    assert back.requests[0].request_id == view.request_id and back.requests[0].grammar is None
    assert back.counters.grammar_steps == snap.counters.grammar_steps


@sync
async def test_a_typed_schema_shows_the_mask_each_step():
    """Stepped by hand: each step's panel agrees with the engine's view of it; the first
    steps are forced ('{"name": "' is the schema's only start: 1 token allowed), so the
    model's top-5 over 512 tokens has at least four choices struck out."""
    src = live_source(concurrency=1)
    try:
        app = RoseplayApp(source=src)
        async with app.run_test(size=(160, 48)) as pilot:
            assert await wait_for(pilot, lambda: app.snapshot is not None, 60)
            src.pause()
            await settle(pilot, src)
            await pilot.press("i", *"to be or not")
            app.query_one("#prompt-sampling").value = \
                f"temperature=0 max_tokens=24 json={json.dumps(SCHEMA, separators=(',', ':'))}"
            await pilot.press("enter", "escape")
            app.set_zoom("detail")           # room for the grammar's two lines
            detail, seen = app.query_one("#detail"), []
            assert await wait_for(pilot, lambda: detail.size.height >= 24, 10)

            def agrees() -> bool:
                g = app.snapshot.request(own_request_id(1)).grammar
                text = widget_text(detail)
                if f"grammar json · {g.state} · {g.allowed:,}/{g.vocab:,} allowed" in text:
                    seen.append((g, text))
                    return True
                return False

            for _ in range(40):
                src.step_once()
                await settle(pilot, src)
                r = app.snapshot.request(own_request_id(1))
                if r is not None and r.grammar.allowed >= 0:
                    assert await wait_for(pilot, agrees, 10), widget_text(detail)
                if len(seen) == 3:
                    break
            assert len(seen) == 3, widget_text(detail)
            for g, text in seen:
                assert g.allowed == 1 and g.state.startswith("expecting '")
                assert "model's top:" in text and text.count("✗") >= 4, text
            app.set_zoom(None)
            assert await wait_for(pilot, lambda: "{you…-1" in widget_text(
                app.query_one(RequestList)), 10)
    finally:
        src.close()


def test_a_grammar_line_fits_the_selected_panel():
    """A 62-column panel (120x40): the one-row line wrapped (`… (0.0%) ·`, then `took`
    and the model's top on a row the panel had no room for, which pushed the next-token
    line out too). Each line now fits: the share goes first, then the top choices."""
    g = GrammarView("json_object", "in number", 2, 4096, ((5, -0.2, False), (9, -1.9, True)), 34)
    for width in (62, 50, 30):
        for rows in (1, 2):
            lines = grammar_text(g, None, rows, width).plain.splitlines()
            assert len(lines) == rows and all(len(line) <= width for line in lines), lines
    assert grammar_text(g, None, 1, 62).plain == \
        "grammar json_object · in number · 2/4,096 allowed · took #34"
    assert grammar_text(GrammarView("regex", "compiling"), None, 1, 40).plain == \
        "grammar regex · compiling"
