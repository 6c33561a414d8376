"""Graceful shutdown of a real `roseplay serve` process (engine in its own process):
SIGTERM stops accepting and lets open streams finish within --shutdown-timeout (exit 0),
or ends them with an OpenAI error event and [DONE] when the time is over (exit 3); an
engine that dies ends every stream the same way and the server exits 4 on its own.
Each test checks the stream bodies, the exit code, and that no engine process, port or
socket dir is left. The engine is held with SIGSTOP (for under a second or two) to keep
streams open at the moment of the signal."""
from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest

from tests.serve.serve_proc import ServeProc, parse_sse, stream_body

pytestmark = pytest.mark.timeout(120)
MAX_TOKENS = 400


class Reader(threading.Thread):
    """Reads one SSE stream to its end on a thread; `first` is set at its first chunk."""

    def __init__(self, url: str, body: dict):
        super().__init__(daemon=True)
        self.url, self.body = url, body
        self.lines: list[str] = []
        self.first = threading.Event()
        self.status = self.exc = None

    def run(self) -> None:
        try:
            with httpx.stream("POST", self.url + "/v1/completions", json=self.body,
                              timeout=60) as r:
                self.status = r.status_code
                for line in r.iter_lines():
                    self.lines.append(line)
                    if line.startswith("data: "):
                        self.first.set()
        except Exception as exc:      # noqa: BLE001 - reported by the test
            self.exc = exc
        finally:
            self.first.set()

    def result(self):
        self.join(60)
        assert not self.is_alive() and self.exc is None and self.status == 200, self.exc
        return parse_sse(self.lines)


def open_streams(url: str, n: int, max_tokens: int = MAX_TOKENS) -> list[Reader]:
    readers = [Reader(url, stream_body(max_tokens)) for _ in range(n)]
    for r in readers:
        r.start()
    for r in readers:
        assert r.first.wait(60)
    return readers


def refused(url: str, timeout: float = 10.0) -> bool:
    """True once a new connection to the server is refused (within `timeout`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(url + "/health", timeout=2)
        except httpx.ConnectError:
            return True
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    return False


def solo_tokens(url: str, max_tokens: int = MAX_TOKENS) -> list[int]:
    body = {**stream_body(max_tokens), "stream": False}
    r = httpx.post(url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


def assert_sigterm_drains_open_streams(srv, streams: int, max_tokens: int = MAX_TOKENS) -> None:
    """SIGTERM while `streams` streams are open: new requests are refused at once, every
    open stream then finishes with a solo run's tokens, and the server exits 0."""
    ref = solo_tokens(srv.url, max_tokens)
    readers = open_streams(srv.url, streams, max_tokens)
    os.kill(srv.engine_pid, signal.SIGSTOP)       # the streams stay open ...
    try:
        srv.signal(signal.SIGTERM)
        assert refused(srv.url), "still accepting after SIGTERM"   # ... while it drains
    finally:
        os.kill(srv.engine_pid, signal.SIGCONT)
    for r in readers:
        ids, errors, reasons, done = r.result()
        assert errors == [] and reasons == ["length"] and done
        assert ids == ref                          # every token, as a solo run
    assert srv.wait() == 0, srv.output


def test_sigterm_lets_open_streams_finish_then_exits_0():
    with ServeProc("--shutdown-timeout", "60") as srv:
        assert_sigterm_drains_open_streams(srv, 3)


def test_sigterm_ends_streams_with_an_error_after_the_drain_time():
    with ServeProc("--shutdown-timeout", "1") as srv:
        readers = open_streams(srv.url, 2)
        os.kill(srv.engine_pid, signal.SIGSTOP)       # they cannot finish in 1 s
        try:
            t0 = time.monotonic()
            srv.signal(signal.SIGTERM)
            for r in readers:
                r.join(30)
            elapsed = time.monotonic() - t0
        finally:
            os.kill(srv.engine_pid, signal.SIGCONT)
        assert 0.9 < elapsed < 20
        for r in readers:
            ids, errors, reasons, done = r.result()
            assert done and reasons == [] and len(errors) == 1, r.lines[-3:]
            assert set(errors[0]) == {"message", "type", "param", "code"}
            assert errors[0]["message"].startswith("the server is shutting down")
        assert srv.wait() == 3, srv.output
        assert "ended 2 open request(s) with an error" in srv.output


def test_engine_death_ends_every_stream_and_the_server_exits_4():
    with ServeProc("--shutdown-timeout", "5") as srv:
        readers = open_streams(srv.url, 2)
        os.kill(srv.engine_pid, signal.SIGSTOP)       # both still open when it dies
        os.kill(srv.engine_pid, signal.SIGKILL)
        for r in readers:
            ids, errors, reasons, done = r.result()
            assert done and len(errors) == 1 and "engine" in errors[0]["message"], r.lines[-3:]
        assert srv.wait(30) == 4, srv.output           # by itself: no signal sent to it
        assert "the engine failed" in srv.output
