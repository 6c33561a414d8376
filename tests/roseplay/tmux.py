"""One private tmux server running the real command at 120x40 (the tmux tests of
tests/roseplay/: test_tui_tmux.py, test_tui_guides_tmux.py, test_tui_spec_compare_tmux.py,
test_signals.py). The command runs with its own TMPDIR, and a test ends it the way a
user does (ctrl+c, the app's quit from any widget), so nothing it made outlives the test."""
from __future__ import annotations

import contextlib
import itertools
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time

from devtools.procs import descendants

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIZE = (120, 40)
QUIT_S = 60.0       # for the app to quit (it joins its engines first) on a loaded host
_SERVERS = itertools.count()


class Tmux:
    """One private tmux server (own socket) running one command in a 120x40 window."""

    def __init__(self, command: list[str], exit_file: str):
        self.socket = f"roseplay-test-{os.getpid()}-{next(_SERVERS)}"   # unique per xdist worker and test
        self.exit_file = exit_file
        # the command's temp files (its engine's socket folder) go here, removed by kill()
        self.tmpdir = tempfile.mkdtemp(prefix="roseplay-tmux-")
        # COLUMNS/LINES can leak into tmux's environment (80x24) and would win over the pty
        shell = (f"unset COLUMNS LINES; export TMPDIR={shlex.quote(self.tmpdir)}; "
                 f"{shlex.join(command)}; echo $? > {shlex.quote(exit_file)}; sleep 30")
        self.socket_path = ""
        try:
            self._tmux("new-session", "-d", "-s", "app", "-x", str(SIZE[0]),
                       "-y", str(SIZE[1]), "-c", ROOT, shell)
            self.socket_path = self._tmux("display-message", "-p", "#{socket_path}").strip()
        except BaseException:
            self.kill()
            raise

    def _tmux(self, *args: str) -> str:
        out = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True,
                             timeout=10)
        return out.stdout

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", "app")

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "app", *keys)

    def wait(self, predicate, timeout: float = 120.0) -> str:
        """The screen once `predicate(screen)` holds (the default allows for a model
        loading on a loaded 2-core host)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.screen()
            if predicate(text):
                return text
            time.sleep(0.1)
        raise AssertionError(f"timed out; the screen shows:\n{self.screen()}")

    def exit_code(self, timeout: float = QUIT_S) -> str:
        """The command's exit status once it has quit (the pane's shell writes it)."""
        code = self._exit_status(timeout)
        assert code is not None, f"still running after {timeout:.0f} s:\n{self.screen()}"
        return code

    def _exit_status(self, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError), open(self.exit_file) as fh:
                code = fh.read().strip()
                if code:
                    return code
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)

    def pane_pid(self) -> int | None:
        out = self._tmux("list-panes", "-t", "app", "-F", "#{pane_pid}").strip()
        return int(out) if out.isdigit() else None

    def kill(self) -> None:
        """End the command as a user does (ctrl+c) and wait for it to exit, then stop the
        server. Only a command that does not quit is killed (SIGKILL), with whatever
        still runs in the pane; its temp folder goes either way."""
        if self.pane_pid() is not None and self._exit_status(0) is None:
            self.keys("C-c")
            self._exit_status(QUIT_S)
        pids = descendants(self.pane_pid())     # the shell (and the command, if it hangs)
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.socket_path:      # the server may leave its socket file behind
            with contextlib.suppress(OSError):
                os.unlink(self.socket_path)
        shutil.rmtree(self.tmpdir, ignore_errors=True)
