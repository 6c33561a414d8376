"""The live source's workload controls: an app attached to another process's engine adds
no load until a scenario is picked (`roseplay --connect`: the driver starts paused), and
the pick starts it."""
from __future__ import annotations

import time

from tests.roseplay.tui.helpers import live_source


def test_picking_a_scenario_starts_an_attached_apps_load():
    src = live_source(scenario="shared-prefix", concurrency=2, paused=True)
    try:
        src.driver.pause()                   # what start_live does when attached (connect=)
        src.resume()                         # the engine runs; the driver still holds back
        held = src.driver.submitted
        src.set_scenario("mixed")
        assert not src.driver.paused
        deadline = time.monotonic() + 120
        while src.driver.submitted == held and time.monotonic() < deadline:
            time.sleep(0.05)
        assert src.driver.submitted > held, "no request after the pick"
        assert src.driver.scenario_name == "mixed"
    finally:
        src.close()
