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
import time

import pytest

from tests.roseplay.serve.open_streams import assert_sigterm_drains_open_streams, open_streams
from tests.roseplay.serve.serve_proc import ServeProc

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
