"""Every guide, walked as a user would: the real `roseplay` command (the bundled model,
the app's defaults) in tmux at 120x40; `?` then the guide's digit; what the guide says
to watch (its `shows`, roseplay/guides.py) must appear on screen within its `within`
seconds. One app for all ten guides (about 20 s: most show within a second or two)."""
from __future__ import annotations

import os
import re
import shutil
import sys
import time

import pytest

from roseplay.guides import GUIDES
from tests.roseplay.tmux import Tmux

pytestmark = [pytest.mark.timeout(150),
              pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")]


def test_every_guide_shows_its_claim_on_screen_in_time(tmp_path):
    exit_file = str(tmp_path / "exit_code")
    tmux = Tmux([sys.executable, "-m", "roseplay"], exit_file)
    try:
        tmux.wait(lambda t: re.search(r"finished [1-9]", t) is not None, 60)
        for guide in GUIDES:
            tmux.keys("?")
            tmux.wait(lambda t: "Knob guidance" in t, 10)
            tmux.keys(guide.key)
            try:
                tmux.wait(lambda t: all(re.search(p, t) for p in guide.shows),
                          guide.within + 2.0)      # + the key's way through tmux
            except AssertionError as exc:          # say which guide and which pattern
                missing = [p for p in guide.shows if not re.search(p, tmux.screen())]
                raise AssertionError(f"guide {guide.key}: {missing} not on screen within "
                                     f"{guide.within + 2.0:g} s\n{exc}") from None
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
