"""Liveness a supervisor can trust, on a real `roseplay serve` (the engine in its own
process), with a short --client-timeout (3 s; the default is 60 s):

- the server process stopped (SIGSTOP) past client_timeout: the engine drops it; once it
  runs again its open stream ends with an error event, it attaches again and serves new
  requests, and /metrics moves again (before: every later request hung, /health said
  200 and /metrics froze); /health says 503 until the engine has welcomed it back;
- the engine stopped past client_timeout: the server judges it gone like any client,
  ends its streams with an error event and exits 4 (before: it waited forever);
- with --api-server-count 2, the serve process killed: the other API server's streams
  end with an error event, never a silent `finish_reason: "abort"`, and it exits; the
  metrics and socket folders the killed process could not remove go at the next start.
"""
from __future__ import annotations

import os
import shutil
import signal
import tempfile

import httpx
import pytest

from engine.front.client import EngineClient
from engine.ipc.leftovers import OwnedDir
from roseplay.serve.app import ServeConfig, build_app
from roseplay.serve.server import ServerThread
from tests.helpers import wait_for
from tests.roseplay.serve.group_proc import GroupProc, per_server, scrape, total
from tests.roseplay.serve.open_streams import Reader, open_streams, solo_tokens
from tests.roseplay.serve.serve_proc import PROMPT, ServeProc, alive, stream_body

pytestmark = pytest.mark.timeout(120)
TIMEOUT = 60
LONG = 1000              # tokens: a stream still running when the server is dropped


def test_a_server_stopped_past_client_timeout_serves_again():
    with ServeProc("--client-timeout", "3") as srv:
        ref = solo_tokens(srv.url, 8)
        watch = EngineClient(connect=f"ipc://{srv.engine_dir}/engine", label="watch")
        try:
            readers = open_streams(srv.url, 8, LONG)
            watch.pause()        # none ends before the drop, however fast the CPU decodes
            srv.signal(signal.SIGSTOP)
            try:
                wait_for(lambda: any(r.finish_reason == "error"
                                     for r in watch.snapshot().requests))   # dropped
            finally:
                srv.signal(signal.SIGCONT)
                watch.resume()
            results = [r.result() for r in readers]
            wait_for(lambda: httpx.get(srv.url + "/health", timeout=10).status_code == 200)
            tokens = total(scrape(srv.url), "vllm:generation_tokens_total")
            assert solo_tokens(srv.url, 8) == ref                 # served again
            wait_for(lambda: total(scrape(srv.url), "vllm:generation_tokens_total") > tokens)
        finally:
            watch.close()
        srv.signal(signal.SIGTERM)
        assert srv.wait() == 0, srv.output
    for reader, (ids, errors, reasons, done) in zip(readers, results):
        assert done and reasons == [] and len(errors) == 1, reader.lines[-3:]
        assert "dropped it" in errors[0]["message"]
    assert "attached to the engine again" in srv.output


@pytest.mark.slow        # the long tier (README)
def test_health_is_503_until_a_dropped_server_is_attached_again():
    """The server's sends held past client_timeout (as a stop of its process would): the
    engine drops it, /health answers 503 while it attaches again, then 200, and it
    serves (before: /health said 200 the whole time, and every request hung)."""
    loop = EngineClient(model="default", device="cpu", num_blocks=256, label="server",
                        snapshots=False, client_timeout=3)
    srv = ServerThread(build_app(loop, ServeConfig())).start()
    try:
        health = lambda: httpx.get(srv.url + "/health", timeout=10)    # noqa: E731
        assert health().status_code == 200
        with loop.transport._send_lock:              # no heartbeat, nor its Hello, leaves
            wait_for(lambda: health().status_code == 503)
            assert "attaching to the engine again" in health().json()["error"]["message"]
        wait_for(lambda: health().status_code == 200)
        body = {**stream_body(8), "stream": False}
        r = httpx.post(srv.url + "/v1/completions", json=body, timeout=TIMEOUT)
        assert r.status_code == 200 and len(r.json()["choices"][0]["token_ids"]) == 8
    finally:
        srv.stop()
        loop.close()


@pytest.mark.slow        # the long tier (README)
def test_an_engine_stopped_past_client_timeout_ends_streams_and_the_server_exits_4():
    with ServeProc("--client-timeout", "3", "--shutdown-timeout", "5") as srv:
        readers = open_streams(srv.url, 2, LONG)
        os.kill(srv.engine_pid, signal.SIGSTOP)      # for good: the server stops it
        for r in readers:
            ids, errors, reasons, done = r.result()
            assert done and reasons == [] and len(errors) == 1, r.lines[-3:]
            assert "sent nothing for 3 s (client_timeout)" in errors[0]["message"]
        assert srv.wait(30) == 4, srv.output
        assert "the engine failed" in srv.output


def connection_on(url: str, api_server: str) -> httpx.Client:
    """A client whose keep-alive connection an API server of the group serves (the
    kernel picks the process per connection; its finished requests tell which)."""
    body = {"model": "default", "prompt": PROMPT, "max_tokens": 1, "temperature": 0}
    for _ in range(64):
        client = httpx.Client(timeout=TIMEOUT)
        before = per_server(scrape(url)).get(api_server, 0)
        assert client.post(url + "/v1/completions", json=body).status_code == 200
        if per_server(scrape(url)).get(api_server, 0) > before:
            return client
        client.close()
    raise AssertionError(f"no connection reached API server {api_server}")


class ClientReader(Reader):
    """Reader on a given client (and so on its connection's API server)."""

    def __init__(self, client: httpx.Client, url: str, body: dict):
        super().__init__(url, body)
        self.client = client

    def stream(self):
        return self.client.stream("POST", self.url + "/v1/completions", json=self.body)


def test_killing_serve_ends_the_other_api_servers_streams_with_an_error(monkeypatch):
    # the server's folders in a temp dir of its own: the sweep of an engine that another
    # test starts meanwhile would remove them (their owner is dead) before they are counted
    private = tempfile.mkdtemp(prefix="rp-live-")
    try:
        _kill_one_serve(monkeypatch, private)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _kill_one_serve(monkeypatch, private: str) -> None:
    with GroupProc("--shutdown-timeout", "5", env=dict(os.environ, TMPDIR=private)) as srv:
        client = connection_on(srv.url, "1")
        try:
            reader = ClientReader(client, srv.url, stream_body(LONG))
            reader.start()
            assert reader.first.wait(TIMEOUT)
            srv.proc.kill()                         # SIGKILL: API server 0 and its drain
            ids, errors, reasons, done = reader.result()
        finally:
            client.close()
        wait_for(lambda: not any(alive(p) for p in srv.api_pids + [srv.engine_pid]))
        assert done and "abort" not in reasons and len(errors) == 1, reader.lines[-3:]
        left = [srv.metrics_dir, srv.engine_dir]
        assert all(os.path.isdir(d) for d in left)  # a killed process removes nothing
        assert all(os.path.dirname(d) == private for d in left), left
        monkeypatch.setattr(tempfile, "tempdir", private)
        OwnedDir("roseplay-").remove()              # the next start's sweep
        assert not any(os.path.exists(d) for d in left)
        srv.wait()
