"""Every guide, walked as a user would: the real `roseplay` command (the bundled model,
the app's defaults) in tmux at 120x40; `?` then the guide's digit; its scorecard says
when its window is clean, then what the guide says to watch (its `shows`,
roseplay/tui/guides/catalog.py) must appear on screen. Each wait is for a condition, with limits
that a loaded 2-core machine meets (`within`, the time on an idle one, is in the
failure message). One app for all eleven guides."""
from __future__ import annotations

import os
import re
import shutil
import sys
import time

import pytest

from roseplay.tui.guides.catalog import GUIDES
from tests.roseplay.tmux import Tmux

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900),
              pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")]
CLEAN_LIMIT = 90.0      # s: the old requests end and 20 steps run (a loaded box: slowly)
SHOW_LIMIT = 60.0       # s after the clean window


def test_every_guide_shows_its_claim_on_screen(tmp_path):
    exit_file = str(tmp_path / "exit_code")
    tmux = Tmux([sys.executable, "-m", "roseplay"], exit_file)
    try:
        tmux.wait(lambda t: re.search(r"finished [1-9]", t) is not None, 120)
        for guide in GUIDES:
            tmux.keys("?")
            tmux.wait(lambda t: "Knob guidance" in t, 30)
            tmux.keys(guide.key)
            tmux.wait(lambda t: f"Guide {guide.key} · scorecard" in t, 30)
            tmux.wait(lambda t: "clean since step" in t or "started after" in t, CLEAN_LIMIT)
            start = time.monotonic()
            try:
                tmux.wait(lambda t: all(re.search(p, t) for p in guide.shows), SHOW_LIMIT)
            except AssertionError as exc:          # say which guide and which pattern
                missing = [p for p in guide.shows if not re.search(p, tmux.screen())]
                raise AssertionError(
                    f"guide {guide.key}: {missing} not on screen {SHOW_LIMIT:g} s after its "
                    f"window was clean (idle box: within {guide.within:g} s)\n{exc}") from None
            print(f"guide {guide.key}: shown {time.monotonic() - start:.1f} s after clean "
                  f"(idle box: within {guide.within:g} s)")
        tmux.keys("q")
        assert tmux.exit_code() == "0"
    finally:
        tmux.kill()


def test_quit_during_the_load_leaves_nothing_in_tmp(tmp_path):
    """The engine's socket folder (roseplay-* in $TMPDIR) goes with a quit while it loads.
    $TMPDIR is this test's own short folder, so engines of other tests running at the
    same time (xdist workers) never show up in it."""
    import glob
    import tempfile
    exit_file = str(tmp_path / "exit_code")
    tmp = tempfile.mkdtemp(prefix="rp-")    # short: the engine's ipc:// paths live under it
    tmux = Tmux(["env", f"TMPDIR={tmp}", sys.executable, "-m", "roseplay"], exit_file)
    try:
        tmux.wait(lambda t: "loading" in t, 30)
        deadline = time.monotonic() + 20
        mine: set = set()
        while not mine and time.monotonic() < deadline:    # the engine's folder exists
            mine = set(glob.glob(os.path.join(tmp, "roseplay-*")))
            time.sleep(0.05)
        assert mine
        tmux.keys("q")
        assert tmux.exit_code(10) == "0"
        assert not [d for d in mine if os.path.exists(d)], mine
    finally:
        tmux.kill()
        shutil.rmtree(tmp, ignore_errors=True)
