"""Signals and quits on the real commands, in real subprocesses: Ctrl-C during
`roseplay bench` stops cleanly and prints what was measured; quitting the TUI while its
model loads is quick; SIGTERM to the TUI restores the terminal. Each test checks that no
engine process is left behind."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.roseplay.tmux import ROOT, Tmux

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
from tests.helpers import engines_owned_by, free_port_block  # noqa: E402

needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


def wait_gone(pid: int, timeout: float = 5.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while engines_owned_by(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return engines_owned_by(pid)


def wait_for_measured_requests(proc: subprocess.Popen, address: str, count: int,
                               timeout: float = 60.0) -> None:
    """Watch the bench's engine (as `roseplay --connect` would) until `count` requests
    have finished, so that the interrupt lands inside the measured run. Fails at once,
    with the bench's output, if the bench exits first."""
    from engine.front.client import EngineClient
    deadline = time.monotonic() + timeout

    def bench_running():
        if proc.poll() is not None:
            pytest.fail(f"the bench exited (rc {proc.returncode}) before the interrupt:\n"
                        f"{proc.stdout.read()[-3000:]}")
        assert time.monotonic() < deadline, "the bench never got going"
        return True

    while bench_running():
        try:
            watcher = EngineClient(connect=address, label="watch", startup_timeout=5)
            break
        except Exception:
            time.sleep(0.2)
    try:
        while watcher.snapshot().counters.finished < count and bench_running():
            time.sleep(0.1)
    finally:
        watcher.close()


def test_ctrl_c_during_bench_prints_what_was_measured(tmp_path):
    out_json = tmp_path / "partial.json"
    address = f"tcp://127.0.0.1:{free_port_block(3)}"
    cmd = [sys.executable, "-m", "roseplay", "bench", "--model", "dummy:tiny", "--device", "cpu",
           "--num-prompts", "5000", "--input-len", "32", "--output-len", "64", "--warmup", "2",
           "--no-progress", "--json", str(out_json), "--engine-address", address]
    # a shell's background job would ignore SIGINT: give the child the default handler
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_for_measured_requests(proc, address, 50)     # 2 warm-up + 48 measured
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, out[-3000:]
    assert time.monotonic() - t0 < 10
    assert "Traceback" not in out and "Aborted" not in out and "terminate called" not in out
    assert "interrupted after" in out and "Run:" in out and "(interrupted)" in out, out[-3000:]
    ok = int(out.split("Successful requests:")[1].split()[0])
    assert 0 < ok < 5000
    assert out_json.exists() and '"mode": "interrupted"' in out_json.read_text()
    assert not wait_gone(proc.pid)


def _tui(tmp_path, model: str) -> tuple[Tmux, str]:
    exit_file = str(tmp_path / "exit_code")
    cmd = [sys.executable, "-m", "roseplay", "--model", model, "--device", "cpu",
           "--num-blocks", "128"]
    return Tmux(cmd, exit_file), exit_file


def _wait_exit(exit_file: str, timeout: float) -> str | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(exit_file):
            with open(exit_file) as f:
                text = f.read().strip()
            if text:
                return text
        time.sleep(0.02)
    return None


def _tui_pid(tmux: Tmux) -> int:
    pane = tmux._tmux("display", "-p", "-t", "app", "#{pane_pid}").strip()
    kids = subprocess.run(["pgrep", "-P", pane], capture_output=True, text=True).stdout.split()
    return int(kids[0])


def _terminal_modes(tmux: Tmux) -> str:
    return tmux._tmux("display", "-p", "-t", "app",
                      "alt=#{alternate_on} mouse=#{mouse_any_flag} cursor=#{cursor_flag}").strip()


@needs_tmux
def test_quit_while_the_model_loads_is_quick(tmp_path):
    tmux, exit_file = _tui(tmp_path, "default")
    try:
        tmux.wait(lambda s: "loading" in s, 30)
        pid = _tui_pid(tmux)
        tmux.keys("q")
        code = _wait_exit(exit_file, 10)        # the load is not waited for (a loaded box:
        assert code == "0", tmux.screen()       # seconds; no tighter bound holds there)
        assert _terminal_modes(tmux) == "alt=0 mouse=0 cursor=1"
        assert not wait_gone(pid), "the engine process outlived the TUI"
    finally:
        tmux.kill()


@needs_tmux
def test_sigterm_restores_the_terminal(tmp_path):
    tmux, exit_file = _tui(tmp_path, "dummy:tiny")
    try:
        tmux.wait(lambda s: "SERVING" in s, 60)
        assert _terminal_modes(tmux) == "alt=1 mouse=1 cursor=0"     # the app's modes
        pid = _tui_pid(tmux)
        os.kill(pid, signal.SIGTERM)
        assert _wait_exit(exit_file, 10) == "143"
        assert _terminal_modes(tmux) == "alt=0 mouse=0 cursor=1"
        assert not wait_gone(pid), "the engine process outlived the TUI"
    finally:
        tmux.kill()
