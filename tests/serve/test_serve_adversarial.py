"""Adversarial clients against one real `roseplay serve` process (engine in its own
process): while greedy neighbour streams run, hostile bodies (tests/serve/hostile_bodies.py,
fixed seed), clients SIGKILLed mid-stream, a SIGSTOP of the server, and a prompt that
takes seconds to tokenize. The neighbours' tokens must equal their solo runs, every
hostile body must get a 4xx OpenAI error (never a 500 or text/plain), nothing may be
left in the engine (an attached client's snapshot: no live request, no used block), and
SIGTERM must then stop the server with exit code 0 and nothing left behind."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time

import httpx
import pytest

from roseplay.serve.app import DEFAULT_TIMEOUT_KEEP_ALIVE_S
from scripts.soak_http import engine_leaks
from tests.serve.hostile_bodies import check_refusal, hostile_bodies
from tests.serve.serve_proc import PROMPT, ServeProc, parse_sse, stream_body

pytestmark = pytest.mark.timeout(180)
SEED, MUTATIONS, PARALLEL = 0, 40, 8
NEIGHBOURS = ["ROMEO.\nWhat news from the court?\n\nJULIET.\n", "HAMLET.\nTo be, or not to be",
              "KING HENRY.\nOnce more unto the breach", "PORTIA.\nThe quality of mercy"]
NEIGHBOUR_TOKENS, ROUNDS = 48, 3
# a stall of the server longer than its keep-alive timeout (kept-alive connections with a
# request waiting must not be closed) and shorter than the engine's dead-client silence
STALL_S = DEFAULT_TIMEOUT_KEEP_ALIVE_S + 1.0
KILLED_CLIENT = """
import httpx, sys, time
with httpx.stream("POST", sys.argv[1] + "/v1/completions", timeout=60, json={
        "model": "default", "prompt": sys.argv[2], "max_tokens": 900, "ignore_eos": True,
        "stream": True}) as r:
    for line in r.iter_lines():
        if line.startswith("data: "):
            print("streaming", flush=True)
            time.sleep(600)
"""


@pytest.fixture(scope="module")
def served():
    with tempfile.TemporaryDirectory(prefix="roseplay-adv-") as tmp:
        address = f"ipc://{tmp}/engine"
        with ServeProc(engine_address=address) as srv:
            srv.address = address
            yield srv
            srv.signal(signal.SIGTERM)
            assert srv.wait() == 0, srv.output


async def stream_ids(h: httpx.AsyncClient, prompt: str,
                     streaming: asyncio.Event | None = None) -> list[int]:
    lines = []
    async with h.stream("POST", "/v1/completions",
                        json=stream_body(NEIGHBOUR_TOKENS, prompt)) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            lines.append(line)
            if streaming is not None:
                streaming.set()
    ids, errors, reasons, done = parse_sse(lines)
    assert errors == [] and reasons == ["length"] and done, errors
    return ids


async def neighbours(h: httpx.AsyncClient, streaming: asyncio.Event):
    async def rounds(prompt):
        return [await stream_ids(h, prompt, streaming) for _ in range(ROUNDS)]
    outs = await asyncio.gather(*(rounds(p) for p in NEIGHBOURS))
    return dict(zip(NEIGHBOURS, outs))


async def send_hostile(h: httpx.AsyncClient) -> tuple[list[str], int]:
    """(what was wrong, how many were sent): PARALLEL bodies in flight at a time."""
    cases, wrong, gate = list(hostile_bodies(SEED, MUTATIONS)), [], asyncio.Semaphore(PARALLEL)

    async def one(name, endpoint, body):
        async with gate:
            r = await h.post(f"/v1/{endpoint}", content=body,
                             headers={"content-type": "application/json"})
        if (problem := check_refusal(name, r.status_code, r.headers.get("content-type", ""),
                                     r.content)) is not None:
            wrong.append(problem)
    await asyncio.gather(*(one(*case) for case in cases))
    return wrong, len(cases)


async def killed_clients(url: str, n: int = 3) -> int:
    """Clients SIGKILLed after their first chunk: the server must cancel their requests."""
    for i in range(n):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", KILLED_CLIENT, url, NEIGHBOURS[i % len(NEIGHBOURS)],
            stdout=subprocess.PIPE)
        try:
            assert await asyncio.wait_for(proc.stdout.readline(), 60) == b"streaming\n"
        finally:
            proc.kill()
            await proc.wait()
    return n


async def stall_server(pid: int, streaming: asyncio.Event) -> float:
    await asyncio.wait_for(streaming.wait(), 60)      # while the neighbours stream
    os.kill(pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(STALL_S)
    finally:
        os.kill(pid, signal.SIGCONT)
    return STALL_S


def test_hostile_clients_do_not_change_neighbours_or_leak(served):
    async def run():
        limits = httpx.Limits(max_connections=64, keepalive_expiry=2.0)
        async with httpx.AsyncClient(base_url=served.url, timeout=120, limits=limits) as h:
            solo = {p: await stream_ids(h, p) for p in NEIGHBOURS}    # one at a time
            streaming = asyncio.Event()
            together = await asyncio.gather(neighbours(h, streaming), send_hostile(h),
                                            killed_clients(served.url),
                                            stall_server(served.proc.pid, streaming))
            return solo, together

    solo, (outs, (wrong, sent), killed, stalled) = asyncio.run(run())
    assert sent >= 90 and killed == 3 and stalled >= 1.0
    assert wrong == [], "\n".join(wrong)
    for prompt, runs in outs.items():
        assert all(ids == solo[prompt] for ids in runs), prompt
    assert engine_leaks(served.address) == (0, 0)       # no live request, no used block
    assert httpx.get(served.url + "/health").status_code == 200


def test_long_prompt_is_tokenized_off_the_event_loop(served):
    """A ~3.5 MB prompt (under the 4 MiB limit) takes seconds to tokenize (then a 400: too
    long for the context); meanwhile /health and a neighbour's stream answer at once."""
    big = {"model": "default", "max_tokens": 4,
           "prompt": "ROMEO.\nWhat news from the court, good sir?\n\n" * 80000}

    async def run():
        async with httpx.AsyncClient(base_url=served.url, timeout=120) as h:
            async def big_one():
                t0 = time.monotonic()
                r = await h.post("/v1/completions", json=big)
                return r, time.monotonic() - t0

            async def neighbour():
                gaps, last = [], time.monotonic()
                async with h.stream("POST", "/v1/completions",
                                    json=stream_body(300, PROMPT)) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data: "):
                            gaps.append(time.monotonic() - last)
                            last = time.monotonic()
                return max(gaps[1:])

            async def health_probe(task):
                worst = 0.0
                while not task.done():
                    t0 = time.monotonic()
                    assert (await h.get("/health")).status_code == 200
                    worst = max(worst, time.monotonic() - t0)
                    await asyncio.sleep(0.05)
                return worst

            task = asyncio.ensure_future(big_one())
            gap, worst = await asyncio.gather(neighbour(), health_probe(task))
            return (*await task, gap, worst)

    r, took, gap, worst = asyncio.run(run())
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text[:200]
    # on the loop, tokenizing would hold /health for all of `took`; a busy box stretches
    # both, so the bound grows with it: 1 s, or a third of `took` when that is more
    bound = max(1.0, took / 3)
    assert worst < bound, f"/health took {worst:.2f} s while the big prompt took {took:.2f} s"
    assert gap < bound, f"a neighbour's stream stalled {gap:.2f} s (the big one {took:.2f} s)"
