"""One private tmux server running the real command at 120x40 (the tmux tests of
tests/roseplay/: test_tui_tmux.py, test_tui_guides_tmux.py, test_signals.py)."""
from __future__ import annotations

import contextlib
import itertools
import os
import shlex
import signal
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIZE = (120, 40)
_SERVERS = itertools.count()


class Tmux:
    """One private tmux server (own socket) running one command in a 120x40 window."""

    def __init__(self, command: list[str], exit_file: str):
        self.socket = f"roseplay-test-{os.getpid()}-{next(_SERVERS)}"   # unique per xdist worker and test
        self.exit_file = exit_file
        # COLUMNS/LINES can leak into tmux's environment (80x24) and would win over the pty
        shell = (f"unset COLUMNS LINES; {shlex.join(command)}; "
                 f"echo $? > {shlex.quote(exit_file)}; sleep 30")
        self._tmux("new-session", "-d", "-s", "app", "-x", str(SIZE[0]), "-y", str(SIZE[1]),
                   "-c", ROOT, shell)
        self.socket_path = self._tmux("display-message", "-p", "#{socket_path}").strip()

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
        pids = descendants(self.pane_pid())
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.socket_path:      # the server may leave its socket file behind
            with contextlib.suppress(OSError):
                os.unlink(self.socket_path)


def descendants(pid: int | None) -> list[int]:
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
