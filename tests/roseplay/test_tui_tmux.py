"""Smoke test of the real command in tmux at 120x40: it serves, takes keys, shows Help and
Quit in the footer, quits with 0. It runs `python -m roseplay` from this checkout (the
installed `roseplay` script may point at another one)."""
from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")]


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIZE = (120, 40)


class Tmux:
    """One private tmux server (own socket) running one command in a 120x40 window."""

    def __init__(self, command: list[str], exit_file: str):
        self.socket = f"roseplay-test-{os.getpid()}"
        self.exit_file = exit_file
        # COLUMNS/LINES can leak into tmux's environment (80x24) and would win over the pty
        shell = (f"unset COLUMNS LINES; {shlex.join(command)}; "
                 f"echo $? > {shlex.quote(exit_file)}; sleep 30")
        self._tmux("new-session", "-d", "-s", "app", "-x", str(SIZE[0]), "-y", str(SIZE[1]),
                   "-c", ROOT, shell)

    def _tmux(self, *args: str) -> str:
        out = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True,
                             timeout=10)
        return out.stdout

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", "app")

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "app", *keys)

    def wait(self, predicate, timeout: float = 40.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.screen()
            if predicate(text):
                return text
            time.sleep(0.1)
        raise AssertionError(f"timed out; the screen shows:\n{self.screen()}")

    def exit_code(self, timeout: float = 20.0) -> str:
        """The command's exit status once it has quit (the pane's shell writes it)."""
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.exit_file) and time.monotonic() < deadline:
            time.sleep(0.05)
        with open(self.exit_file) as fh:
            return fh.read().strip()

    def pane_pid(self) -> int | None:
        out = self._tmux("list-panes", "-t", "app", "-F", "#{pane_pid}").strip()
        return int(out) if out.isdigit() else None

    def kill(self) -> None:
        """Kill the server, then whatever still runs in the pane (nothing may outlive a test)."""
        pids = _descendants(self.pane_pid())
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _descendants(pid: int | None) -> list[int]:
    """pid and every process below it (from /proc)."""
    if pid is None:
        return []
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
    return out


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
        pids = _descendants(tmux.pane_pid())
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
