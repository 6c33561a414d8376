"""Open SSE streams on a real `roseplay serve` and the SIGTERM drain check, shared by
tests/roseplay/serve/test_serve_shutdown.py and test_serve_multiproc.py."""
from __future__ import annotations

import os
import signal
import threading
import time

import httpx

from tests.roseplay.serve.serve_proc import parse_sse, stream_body

MAX_TOKENS = 400


class Reader(threading.Thread):
    """Reads one SSE stream to its end on a thread; `first` is set at its first chunk."""

    def __init__(self, url: str, body: dict):
        super().__init__(daemon=True)
        self.url, self.body = url, body
        self.lines: list[str] = []
        self.first = threading.Event()
        self.status = self.exc = None

    def stream(self):
        """The POST this reader reads (a subclass may send it through its own client)."""
        return httpx.stream("POST", self.url + "/v1/completions", json=self.body, timeout=60)

    def run(self) -> None:
        try:
            with self.stream() as r:
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


def assert_sigterm_drains_open_streams(srv, streams: int, max_tokens: int = MAX_TOKENS,
                                       group: bool = False) -> None:
    """SIGTERM while `streams` streams are open: new requests are refused at once, every
    open stream then finishes with a solo run's tokens, and the server exits 0. `group`:
    the signal goes to the server's whole process group, its engine process too."""
    ref = solo_tokens(srv.url, max_tokens)
    readers = open_streams(srv.url, streams, max_tokens)
    os.kill(srv.engine_pid, signal.SIGSTOP)       # the streams stay open ...
    try:
        srv.signal(signal.SIGTERM, group)
        assert refused(srv.url), "still accepting after SIGTERM"   # ... while it drains
    finally:
        os.kill(srv.engine_pid, signal.SIGCONT)
    for r in readers:
        ids, errors, reasons, done = r.result()
        assert errors == [] and reasons == ["length"] and done
        assert ids == ref                          # every token, as a solo run
    assert srv.wait() == 0, srv.output
