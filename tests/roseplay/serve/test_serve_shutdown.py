"""Graceful shutdown of a real `roseplay serve` process (engine in its own process):
SIGTERM stops accepting and lets open streams finish within --shutdown-timeout (exit 0),
or ends them with an OpenAI error event and [DONE] when the time is over (exit 3); an
engine that dies ends every stream the same way and the server exits 4 on its own.
Each test checks the stream bodies, the exit code, and that no engine process, port or
socket dir is left. The engine is held with SIGSTOP (for under a second or two) to keep
streams open at the moment of the signal."""
from __future__ import annotations

import os
import re
import signal
import socket
import time

import httpx
import pytest

from tests import helpers
from tests.roseplay.serve.open_streams import assert_sigterm_drains_open_streams, open_streams
from tests.roseplay.serve.raw_sockets import post_unread, read_until
from tests.roseplay.serve.serve_proc import PROMPT, ServeProc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_sigterm_lets_open_streams_finish_then_exits_0():
    with ServeProc("--shutdown-timeout", "60") as srv:
        assert_sigterm_drains_open_streams(srv, 3)


def test_sigterm_to_the_whole_group_drains_open_streams_then_exits_0():
    """systemd's stop (every process of the unit), `timeout`, `kill -TERM -PGID`: the
    engine process gets SIGTERM with the server and serves its drain. Before, it stopped
    at once: the streams ended with "the engine process got SIGTERM", exit 4."""
    with ServeProc("--shutdown-timeout", "60", new_session=True) as srv:
        assert_sigterm_drains_open_streams(srv, 2, group=True)


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



# ~10 MB of SSE (~700 bytes a token), more than the kernel's socket buffers (4 MiB at most)
BIG_STREAM = {"model": "default", "prompt": PROMPT, "max_tokens": 900, "n": 16, "logprobs": 20,
              "ignore_eos": True, "stream": True}
UNBOUNDED = ("--max-stream-backlog", str(10 ** 9))     # the client is slow on purpose


def _running(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return float(re.search(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", text, re.M).group(1))


def _unread_big_stream(srv, rcvbuf: int = 2048) -> socket.socket:
    """BIG_STREAM on a connection left unread until the engine has made all of it: the
    server holds megabytes for it, its write waiting."""
    sock = post_unread(srv.port, "/v1/completions", BIG_STREAM, rcvbuf)
    try:
        helpers.wait_for(lambda: _running(srv.url) == BIG_STREAM["n"], 60)
        helpers.wait_for(lambda: _running(srv.url) == 0, 90)
    except BaseException:
        sock.close()
        raise
    return sock


def test_the_drain_waits_for_a_slow_reader_s_last_bytes():
    """The drain waited for a stream's engine events to be read, not written: with all
    of them read, its last megabytes still going out to a slow client, the server called
    the drain over and uvicorn cut the stream 2 s later (no [DONE]; exit code 0)."""
    with ServeProc("--shutdown-timeout", "60", *UNBOUNDED) as srv:
        with _unread_big_stream(srv, rcvbuf=1 << 16) as sock:
            srv.signal(signal.SIGTERM)
            sock.settimeout(60)       # ~1 MB/s: the ~10 MB take longer than uvicorn's 2 s
            data = read_until(sock, b"data: [DONE]", chunk=1 << 16, pause=0.05)
        assert data.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"), data[-300:]
        assert data.count(b'"finish_reason":"length"') == BIG_STREAM["n"]
        assert b'"error"' not in data
        assert srv.wait() == 0, srv.output


def test_a_stream_nobody_reads_is_closed_at_the_drain_end_without_a_traceback():
    """A client that reads nothing of its stream: at the drain's end uvicorn cancels the
    waiting write. The server logged "Exception in ASGI application" with a 40-line
    CancelledError traceback and exited 0 (its events were read, so it counted as
    drained). Now: exit 3, the cut named in one line, no traceback."""
    with ServeProc("--shutdown-timeout", "1", *UNBOUNDED) as srv:
        with _unread_big_stream(srv):
            srv.signal(signal.SIGTERM)
            assert srv.wait(60) == 3, srv.output
        assert "1 response(s) not read by their clients in the drain time are cut" in srv.output
        assert "Traceback" not in srv.output and "CancelledError" not in srv.output, srv.output
