"""Smoke test of the real command in tmux at 120x40: it serves, takes keys, shows Help and
Quit in the footer, quits with 0 and leaves nothing in its temp folder. It runs `python -m roseplay` from this checkout (the
installed `roseplay` script may point at another one)."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from devtools.procs import descendants
from tests.roseplay.tmux import Tmux

pytestmark = [pytest.mark.timeout(600),
              pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")]


KEY_S = 60.0        # for the app to answer a key on a loaded 2-core host


def _finished(text: str) -> int:
    m = re.search(r"finished (\d+)", text)
    return int(m.group(1)) if m else -1


def _step(text: str) -> int:
    m = re.search(r"step (\d+)", text)
    return int(m.group(1)) if m else -1


def _settled_step(tmux: Tmux, timeout: float = KEY_S) -> int:
    """The step count once two screens 0.5 s apart agree on it (a paused engine)."""
    deadline, last = time.monotonic() + timeout, _step(tmux.screen())
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = _step(tmux.screen())
        if now == last:
            return now
        last = now
    raise AssertionError(f"the step count kept moving while paused:\n{tmux.screen()}")


def test_roseplay_command_in_tmux(tmp_path):
    cmd = [sys.executable, "-m", "roseplay", "--model", "dummy:tiny", "--device", "cpu", "--num-blocks", "128",
            "--concurrency", "8", "--output-len", "16"]
    exit_file = str(tmp_path / "exit_code")
    tmux = Tmux(cmd, exit_file)
    try:
        text = tmux.wait(lambda t: _finished(t) >= 8)
        assert "SERVING" in text and "KV cache · 128 blocks × 16 tokens" in text
        assert "finished" in text and "Requests" in text and "Timing" in text
        footer = text.rstrip("\n").splitlines()[-1]
        assert "? Help" in footer and "q Quit" in footer, footer
        tmux.keys("c")
        tmux.wait(lambda t: re.search(r"OFF +enable_prefix_caching", t), KEY_S)
        tmux.keys("+")                     # doubles: 512 -> 1024
        tmux.wait(lambda t: "1024 tok/step" in t, KEY_S)
        tmux.keys("space")
        tmux.wait(lambda t: "PAUSED" in t, KEY_S)
        step = _settled_step(tmux)         # the step in flight at the pause has landed
        time.sleep(0.8)
        assert _step(tmux.screen()) == step, "the engine stepped while paused"
        tmux.keys("n")
        tmux.wait(lambda t: _step(t) == step + 1, KEY_S)
        tmux.keys("q")
        assert tmux.exit_code() == "0"
        # its engine's socket folder went with it (torch may keep a cache folder there)
        assert not [n for n in os.listdir(tmux.tmpdir) if n.startswith("roseplay-")]
    finally:
        tmux.kill()
    assert not os.path.exists(tmux.tmpdir)


def test_a_vanished_terminal_ends_the_app_and_its_engine(tmp_path):
    """The terminal goes away (tmux killed: SIGHUP, and the pty is gone): the app and its
    engine process exit within seconds instead of spinning on a dead terminal."""
    cmd = [sys.executable, "-m", "roseplay", "--model", "dummy:tiny", "--device", "cpu",
           "--num-blocks", "128", "--concurrency", "8", "--output-len", "16"]
    tmux = Tmux(cmd, str(tmp_path / "exit_code"))
    pids = []
    try:
        tmux.wait(lambda t: _finished(t) >= 1)
        pids = descendants(tmux.pane_pid())
        assert len(pids) >= 3, pids          # the shell, the app, its engine process
        subprocess.run(["tmux", "-L", tmux.socket, "kill-server"], capture_output=True)
        deadline = time.monotonic() + 60            # seconds: generous for a loaded host
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.2)
        assert not [p for p in pids if _alive(p)], "still running after the terminal went"
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        tmux.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return False
