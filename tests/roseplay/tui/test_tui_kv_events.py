"""`--kv-events-config`: the top line says where the engine publishes its KV events (the
endpoint its client's Welcome names), and nothing without them; no panel said it."""
from __future__ import annotations

import pytest

from roseplay.tui.app import RoseplayApp
from roseplay.tui.widgets.status import StatusBar
from tests.helpers import free_port_block
from tests.roseplay.tui.helpers import live_source, sync, wait_for, widget_text

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("fast_pilot")]


@pytest.mark.parametrize("events", [True, False])
@sync
async def test_the_top_line_names_the_kv_events_endpoint(events):
    port = free_port_block(2)
    config = {"enable_kv_cache_events": True, "endpoint": f"tcp://127.0.0.1:{port}",
              "replay_endpoint": f"tcp://127.0.0.1:{port + 1}"}
    src = live_source(in_process=False, paused=True,
                      engine=dict(kv_events_config=config) if events else {})
    try:
        for size in ((200, 60), (80, 24)):
            app = RoseplayApp(source=src)
            async with app.run_test(size=size) as pilot:
                bar = app.query_one(StatusBar)
                assert await wait_for(pilot, lambda: "step" in widget_text(bar))
                line = widget_text(bar)
                assert ("KV events" in line) == (events and size[0] == 200), line
                if events and size[0] == 200:
                    assert f"KV events {config['endpoint']}" in line, line
                assert "…" not in line, line
    finally:
        src.close()
