"""SVG snapshots of the compare screen (a paused replay of the committed compare
recording, tests/roseplay/tui/data/compare_session*.jsonl.gz: every number is recorded data) at
120x40 and 80x24, and of the help screen's knob guidance.

Update after an intended visual change:
    pytest tests/roseplay/tui/test_compare_snapshot.py --snapshot-update
"""
from __future__ import annotations

import pytest

from roseplay.tui.app import RoseplayApp
from roseplay.tui.compare import CompareReplaySource
from roseplay.tui.compare_app import CompareApp
from roseplay.workload.source import ReplaySource
from tests.roseplay.tui.helpers import DATA, SESSION, keys_redrawing, steps_then_keys

pytestmark = pytest.mark.timeout(120)
COMPARE_SESSION = f"{DATA}/compare_session.jsonl.gz"


@pytest.mark.parametrize("size", [(120, 40), (80, 24)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_snapshot_compare_side_by_side(snap_compare, size):
    """Frame 25 of prefix caching on (A) vs off (B) on shared prefixes, goodput SLOs set."""
    app = CompareApp(source=CompareReplaySource(COMPARE_SESSION, start_paused=True),
                     slos={"ttft": 200.0, "tpot": 50.0})
    assert snap_compare(app, terminal_size=size, run_before=steps_then_keys(24))


def test_snapshot_help_guidance(snap_compare):
    app = RoseplayApp(source=ReplaySource(SESSION, start_paused=True))
    assert snap_compare(app, terminal_size=(120, 40), run_before=keys_redrawing("question_mark"))
