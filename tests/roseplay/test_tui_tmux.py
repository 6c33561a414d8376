"""Smoke test of the real command in tmux at 120x40: it serves, takes keys, shows Help and
Quit in the footer, quits with 0. It runs `python -m roseplay` from this checkout (the
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

from tests.roseplay.tmux import Tmux, descendants

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")]


def _finished(text: str) -> int:
    m = re.search(r"finished (\d+)", text)
    return int(m.group(1)) if m else -1


def _step(text: str) -> int:
    m = re.search(r"step (\d+)", text)
    return int(m.group(1)) if m else -1


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
        tmux.wait(lambda t: re.search(r"OFF +enable_prefix_caching", t), 10)
        tmux.keys("+")                     # doubles: 512 -> 1024
        tmux.wait(lambda t: "1024 tok/step" in t, 10)
        tmux.keys("space")
        text = tmux.wait(lambda t: "PAUSED" in t, 10)
        time.sleep(0.5)
        step = _step(tmux.screen())
        time.sleep(0.8)
        assert _step(tmux.screen()) == step, "the engine stepped while paused"
        tmux.keys("n")
        tmux.wait(lambda t: _step(t) == step + 1, 10)
        tmux.keys("q")
        assert tmux.exit_code() == "0"
    finally:
        tmux.kill()


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
        deadline = time.monotonic() + 15
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
