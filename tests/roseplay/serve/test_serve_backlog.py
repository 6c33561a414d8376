"""A stream's unread backlog is bounded (--max-stream-backlog): the engine never waits for
a client, so a client that reads slower than its tokens come left them all queued in the
server (a never-read n=128 stream with 20 logprobs grew the server by ~270 MB). Past the
bound the stream's queue is dropped, its requests are cancelled, and it ends with an
error event and [DONE]; a client that keeps up is never cut, however long its stream."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from engine.front.loop import EngineLoop
from roseplay.serve.app import ServeConfig, build_app
from roseplay.serve.bridge import EngineBridge
from roseplay.serve.server import ServerThread
from tests import helpers
from tests.roseplay.serve.raw_sockets import post_unread, read_until

pytestmark = pytest.mark.timeout(120)
PROMPT = "ROMEO.\nWhat news from the court?\n\nJULIET.\n"


class FakeLoop:
    """An engine front that only records what is submitted and cancelled."""

    def __init__(self):
        self.cancelled: list[str] = []

    def submit(self, prompt, params, request_id, **kwargs):
        return SimpleNamespace(detach=lambda: None)

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)


NO_METRICS = SimpleNamespace(observe_tokens=lambda *a: None, observe_finish=lambda *a: None,
                             observe_request=lambda *a: None)


def tokens(rid: str, k: int, finished: bool = False):
    return SimpleNamespace(request_id=rid, token_ids=tuple(range(k)), token_times=(0.0,) * k,
                           text="x" * k, finished=finished,
                           finish_reason="length" if finished else None, error=None,
                           output=None)


async def _generation(max_backlog: int, n: int, logprobs: int | None):
    fake = FakeLoop()
    bridge = EngineBridge(fake, NO_METRICS, max_backlog=max_backlog)
    params = SimpleNamespace(max_tokens=10_000, logprobs=logprobs)
    gen = bridge.start("cmpl-t", [{"prompt_token_ids": [1, 2]}] * n, [params] * n)
    return fake, gen


async def _read_all(gen) -> list:
    return [event async for batch in gen.batches() for _, event in batch]


def test_an_unread_backlog_past_the_bound_is_dropped_and_the_stream_ends_with_an_error():
    async def run():
        fake, gen = await _generation(max_backlog=1000, n=2, logprobs=None)
        for _ in range(600):               # 1,200 tokens unread: past 1,000
            gen._receive(tokens("cmpl-t-0", 1))
            gen._receive(tokens("cmpl-t-1", 1))
        assert len(gen._queue) == 0        # freed at once, not when the client reads
        assert sorted(fake.cancelled) == ["cmpl-t-0", "cmpl-t-1"]
        gen._receive(tokens("cmpl-t-0", 5))       # in flight before the cancel: dropped
        await asyncio.sleep(0)             # the mailbox delivers the two error ends
        events = await _read_all(gen)
        assert [e.finish_reason for e in events] == ["error", "error"]
        assert all("--max-stream-backlog" in e.error for e in events)
        assert gen.done
    asyncio.run(run())


def test_logprobs_count_towards_the_backlog():
    async def run():
        fake, gen = await _generation(max_backlog=1000, n=1, logprobs=20)
        for _ in range(40):                # 40 tokens x (1 + 1 + 20) = 880
            gen._receive(tokens("cmpl-t-0", 1))
        assert fake.cancelled == []
        for _ in range(6):                 # 46 x 22 = 1,012
            gen._receive(tokens("cmpl-t-0", 1))
        assert fake.cancelled == ["cmpl-t-0"]
    asyncio.run(run())


def test_a_reader_that_keeps_up_is_never_cut():
    async def run():
        fake, gen = await _generation(max_backlog=100, n=1, logprobs=None)
        read = []

        async def reader():
            async for batch in gen.batches():
                read.extend(event for _, event in batch)
        task = asyncio.ensure_future(reader())
        for i in range(500):               # 5,000 tokens in all, 10 unread at a time
            gen._receive(tokens("cmpl-t-0", 10, finished=i == 499))
            await asyncio.sleep(0)
        await task
        assert fake.cancelled == [] and sum(len(e.token_ids) for e in read) == 5000
        assert read[-1].finish_reason == "length"
    asyncio.run(run())


@pytest.fixture(scope="module")
def loop():
    loop = EngineLoop(device="cpu")
    yield loop
    loop.close()


def _live(loop):
    return [r for r in loop.snapshot().requests if r.state not in ("finished", "cancelled", "error")]


def test_a_client_that_reads_nothing_has_its_requests_cancelled_then_gets_an_error(loop):
    """A raw socket with a 2 KiB receive buffer that reads nothing asks for 4 x 900 tokens
    with 20 logprobs (~9 MB of SSE): its requests are cancelled long before their 900th
    token; once it reads, its stream ends with an error event naming the flag, and
    [DONE]."""
    config = ServeConfig(max_stream_backlog=2000)
    body = {"model": "default", "prompt": PROMPT, "max_tokens": 900, "n": 4, "logprobs": 20,
            "ignore_eos": True, "stream": True}
    with ServerThread(build_app(loop, config)) as srv:
        with post_unread(srv.port, "/v1/completions", body) as slow:
            helpers.wait_for(lambda: _live(loop), 60)
            rids = [r.request_id for r in _live(loop)]
            helpers.wait_for(lambda: not _live(loop), 90)
            for rid in rids:
                req = loop.snapshot().request(rid)
                assert req.state == "cancelled" and req.output_tokens < 900, req
            slow.settimeout(60)
            data = read_until(slow, b"data: [DONE]")
            assert b"data: [DONE]" in data, data[-300:]
            assert data.count(b"--max-stream-backlog") == 4, data[-600:]   # one per choice
        helpers.wait_for(lambda: loop.snapshot().num_used == 0, 30)
