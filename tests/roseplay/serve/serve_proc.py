"""`roseplay serve` as a real subprocess on a free 127.0.0.1 port (the default path: the
engine in its own process), for the shutdown and adversarial tests: start, wait for
/health, read its stream bodies, signal it, and check that nothing is left behind."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import httpx

from devtools.procs import children
from tests.helpers import free_port_block

PROMPT = "ROMEO.\nWhat news from the court?\n\nJULIET.\n"
START_TIMEOUT = 120


def free_port() -> int:
    """A free 127.0.0.1 port for the server (tests/helpers.free_port_block)."""
    return free_port_block(1)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class ServeProc:
    """with ServeProc("--shutdown-timeout", "1") as srv: srv.url, srv.proc, srv.engine_pid"""

    def __init__(self, *args: str, engine_address: str | None = None, env: dict | None = None,
                 new_session: bool = False, engines: int = 1):
        """env: the server's environment (default: this process's); new_session: the
        server and its engine in a process group of their own, which signal(group=True)
        signals whole (as systemd's stop and `timeout` do); engines: how many engine
        processes it starts (--data-parallel-size), their pids in engine_pids."""
        self.env, self.new_session, self.engines = env, new_session, engines
        self.engine_pids: list[int] = []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = ["--port", str(self.port), "--log-level", "warning", *args]
        if engine_address:
            self.args += ["--engine-address", engine_address]
        self.proc: subprocess.Popen | None = None
        self.engine_pid: int | None = None
        self.engine_dir: str | None = None       # the private ipc dir, when serve made one
        self.output = ""

    def __enter__(self) -> "ServeProc":
        # output to a file: a pipe read only at the end could fill up and block the server
        self._log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen([sys.executable, "-m", "roseplay", "serve", *self.args],
                                     stdout=self._log, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=self.new_session)
        try:
            return self._come_up()
        except BaseException:       # not up in time (or interrupted): leave nothing running
            self._kill_all()
            self._log.close()
            raise

    def _kill_all(self) -> None:
        """The server, its engine process and the engine's private folder, whatever state
        the start reached."""
        kids = children(self.proc.pid) if self.proc.poll() is None else []
        self.proc.send_signal(signal.SIGINT)     # its own clean-up first (its engine folder)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._find_engine_dir()
        if self.engine_dir:
            shutil.rmtree(self.engine_dir, ignore_errors=True)

    def _find_engine_dir(self) -> None:
        self._read_log()       # the address is printed before uvicorn starts
        match = re.search(r"--connect ipc://(\S+)/engine`", self.output)
        if match and "--engine-address" not in self.args:
            self.engine_dir = match.group(1)        # made by serve: it must remove it

    def _come_up(self) -> "ServeProc":
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert self.proc.poll() is None, self._read_log()
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "roseplay serve did not come up"
            time.sleep(0.2)
        self.engine_pid = self._engine_pid()
        self._find_engine_dir()
        return self

    def _engine_pid(self) -> int:
        self.engine_pids = sorted(children(self.proc.pid), key=_replica_rank)
        assert len(self.engine_pids) == self.engines, self.engine_pids
        return self.engine_pids[0]

    def signal(self, sig: int, group: bool = False) -> None:
        if group:
            assert self.new_session, "the test's own group would be signalled"
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)

    def _read_log(self) -> str:
        self._log.seek(0)
        self.output = self._log.read()
        return self.output

    def wait(self, timeout: float = 60) -> int:
        """Exit code; the output is kept in self.output."""
        code = self.proc.wait(timeout)
        self._read_log()
        return code

    def __exit__(self, *exc) -> None:
        try:
            self._stop(exc[0] is None)
        finally:
            self._log.close()

    def _stop(self, check: bool) -> None:
        if self.proc.poll() is None:         # the test failed: clean up, check nothing
            for pid in self.engine_pids:
                if alive(pid):
                    os.kill(pid, signal.SIGCONT)     # a test may have stopped it
            self.proc.kill()
            self.wait()
            if self.engine_dir:
                shutil.rmtree(self.engine_dir, ignore_errors=True)
            return
        if check:
            self.assert_clean()

    def assert_clean(self) -> None:
        """No engine process, no listening socket, no engine tmp dir left."""
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in self.engine_pids):
            assert time.monotonic() < deadline, "an engine process outlived the server"
            time.sleep(0.05)
        try:
            httpx.get(self.url + "/health", timeout=2)
            raise AssertionError("the server port still answers")
        except httpx.ConnectError:
            pass
        assert self.engine_dir is None or not os.path.exists(self.engine_dir), self.engine_dir


def _replica_rank(pid: int) -> int:
    """The data_parallel_rank an engine process was started with (0 alone)."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        match = re.search(rb'"data_parallel_rank": (\d+)', f.read())
    return int(match.group(1)) if match else 0


def stream_body(max_tokens: int, prompt: str = PROMPT, **extra) -> dict:
    return {"model": "default", "prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "temperature": 0, "ignore_eos": True, "return_token_ids": True, **extra}


def parse_sse(lines) -> tuple[list[int], list[dict], list[str | None], bool]:
    """(token ids, error bodies, finish reasons, ended with [DONE]) of an SSE body."""
    ids, errors, reasons, done = [], [], [], False
    for line in lines:
        if not line.startswith("data: "):
            continue
        assert not done, f"data after [DONE]: {line}"
        if line == "data: [DONE]":
            done = True
            continue
        msg = json.loads(line[6:])
        if "error" in msg:
            errors.append(msg["error"])
            continue
        for choice in msg["choices"]:
            ids += choice.get("token_ids") or []
            reasons.append(choice.get("finish_reason"))
    return ids, errors, [r for r in reasons if r], done
