"""uvicorn's two HTTP/1.1 parsers under the server's own timeouts (roseplay/serve/server.py):
httptools, the default, and h11 (`serve --http h11`), both on one engine process. For each:
a slow client is cut after the request-read timeout whether its headers or its body
trickle; an idle kept-alive connection is closed after the keep-alive timeout; pipelined
requests are all answered in order and a request already read is never cut by the read
timeout, however long its answer takes. And which prompts are turned into engine inputs
on the event loop (short ones) or on a worker thread (long ones, or many), and which
choices ask the engine for prompt logprobs."""
from __future__ import annotations

import json
import os
import signal
import socket
import time

import msgspec
import pytest

from engine.front.client import EngineClient
from roseplay.serve.app import HTTP_PARSERS, ServeConfig, build_app
from roseplay.serve.prompts import (ON_LOOP_ITEMS, ON_LOOP_TEXT_CHARS, ON_LOOP_TOKEN_IDS,
                                    completion_inputs, on_loop)
from roseplay.serve.protocol import ChatCompletionRequest, CompletionRequest
from roseplay.serve.server import ServerThread
from tests.roseplay.serve.raw_sockets import closed_after, connect

pytestmark = pytest.mark.timeout(120)
READ_TIMEOUT, KEEP_ALIVE = 1.0, 0.5
PROMPT = "ROMEO.\nWhat news from the court?\n\nJULIET.\n"


@pytest.fixture(scope="module")
def engine():
    with EngineClient(label="server", snapshots=False) as loop:
        yield loop


@pytest.fixture(scope="module", params=HTTP_PARSERS)
def server(request, engine):
    config = ServeConfig(http=request.param, timeout_request_read=READ_TIMEOUT,
                         timeout_keep_alive=KEEP_ALIVE)
    with ServerThread(build_app(engine, config)) as srv:
        yield srv


def _post(body: dict) -> bytes:
    data = json.dumps(body).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(data)) + data


class Answers:
    """Content-Length answers read off one socket, in order (bytes past one are kept)."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buf = sock, b""

    def _more(self) -> None:
        self.buf += self.sock.recv(65536) or pytest.fail("the server closed the connection")

    def read(self, n: int) -> list[tuple[bytes, bytes]]:
        """n answers: (status line, body) each."""
        out = []
        while len(out) < n:
            while b"\r\n\r\n" not in self.buf:
                self._more()
            head = self.buf.split(b"\r\n\r\n", 1)[0]
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:")))
            while len(self.buf) < len(head) + 4 + length:
                self._more()
            start = len(head) + 4
            out.append((head.split(b"\r\n")[0], self.buf[start:start + length]))
            self.buf = self.buf[start + length:]
        return out


def test_slow_headers_and_slow_bodies_are_cut_after_the_read_timeout(server):
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n"
    for sent, trickle in ((b"", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" * 8),
                          (head, b'{"model": ' + b" " * 480)):       # headers, then a body
        sock = connect(server)
        try:
            sock.sendall(sent)
            waited = closed_after(sock, trickle)
        finally:
            sock.close()
        assert READ_TIMEOUT - 0.3 < waited < READ_TIMEOUT + 5, (sent, waited)


def test_idle_kept_alive_connection_is_closed_after_the_keep_alive_timeout(server):
    sock = connect(server)
    try:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert Answers(sock).read(1)[0][0] == b"HTTP/1.1 200 OK"
        waited = closed_after(sock)
    finally:
        sock.close()
    assert KEEP_ALIVE - 0.3 < waited < READ_TIMEOUT, waited


def test_pipelined_requests_are_answered_in_order_and_never_cut(server, engine):
    """Three requests in one write; the engine is stopped for longer than the read timeout
    after the first answer, so the second answer comes later than that (every request was
    read whole at once: no timer may cut the connection)."""
    quick = {"model": "default", "prompt": PROMPT, "max_tokens": 1, "temperature": 0}
    slow = dict(quick, max_tokens=64, ignore_eos=True)
    sock = connect(server)
    try:
        sock.sendall(_post(quick) + _post(slow) + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        reader = Answers(sock)
        answers = reader.read(1)
        os.kill(engine.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(READ_TIMEOUT + 0.5)
        finally:
            os.kill(engine.proc.pid, signal.SIGCONT)
        answers += reader.read(2)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")       # still open
        assert reader.read(1)[0][0] == b"HTTP/1.1 200 OK"
    finally:
        sock.close()
    assert [a[0] for a in answers] == [b"HTTP/1.1 200 OK"] * 3
    first, second = (json.loads(a[1]) for a in answers[:2])
    assert first["usage"]["completion_tokens"] == 1
    assert second["usage"]["completion_tokens"] == 64


def test_only_choice_0_of_a_prompt_asks_for_its_prompt_logprobs():
    """echo + logprobs with n (or best_of) > 1: one prompt-logprobs computation per
    prompt; the routes show choice 0's list for every choice (roseplay/serve/siblings.py)."""
    for extra in ({"n": 4}, {"n": 2, "best_of": 3}):
        req = msgspec.convert({"model": "default", "prompt": [[1, 2, 3], [4, 5]], "echo": True,
                               "logprobs": 2, **extra}, type=CompletionRequest)
        ins = completion_inputs(req, None, 64, 4096)
        k = req.num_candidates
        asked = [p.prompt_logprobs for p in ins.params]
        assert asked == ([2] + [None] * (k - 1)) * 2, asked
        assert all(p.logprobs == 2 for p in ins.params)
    req = msgspec.convert({"model": "default", "prompt": [1, 2], "n": 3, "logprobs": 1},
                          type=CompletionRequest)
    assert [p.prompt_logprobs for p in completion_inputs(req, None, 64, 4096).params] == \
        [None] * 3                                       # no echo: none asked


@pytest.mark.parametrize("body,here", [
    ({"prompt": list(range(512))}, True),                    # W1's prompts: no thread hop
    ({"prompt": "ROMEO." * 100}, True),
    ({"prompt": [[1] * 1000, [2] * 1000]}, True),
    ({"prompt": list(range(ON_LOOP_TOKEN_IDS + 1))}, False),
    ({"prompt": ["x" * 600, "y" * 600]}, False),             # long text: a worker thread
    ({"messages": [{"role": "user", "content": "x" * (ON_LOOP_TEXT_CHARS + 1)}]}, False),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}, True),
    # each prompt, message or part is a tokenizer or template pass whatever its length
    ({"prompt": ["x"] * (ON_LOOP_ITEMS + 1)}, False),
    ({"prompt": [[1]] * (ON_LOOP_ITEMS + 1)}, False),
    ({"messages": [{"role": "user", "content": ""}] * (ON_LOOP_ITEMS + 1)}, False),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": ""}] *
                    ON_LOOP_ITEMS}]}, False),
    ({"messages": [{"role": "user", "content": ""}] * ON_LOOP_ITEMS}, True)])
def test_short_prompts_are_built_on_the_event_loop_long_ones_on_a_thread(body, here):
    model = ChatCompletionRequest if "messages" in body else CompletionRequest
    assert on_loop(msgspec.convert({"model": "default", **body}, type=model)) is here
