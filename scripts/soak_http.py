"""Soak `roseplay serve` (the default engine-process path, bundled model, CPU) through HTTP
with mixed clients, and watch the server's and the engine's memory and threads.

Clients (asyncio tasks, --clients of them) each loop over a seeded mix of:
  good      greedy streams (temperature 0): every answer to the same prompt must be the
            same tokens (the first one is the reference)
  plain     non-streamed completions and chats (n up to 2)
  bad       a hostile body (devtools/hostile_bodies.py): must get a 4xx OpenAI error
  cancelled a stream closed after its first chunks
  stalled   a stream not read for 1-4 s, then read to its end: same tokens as `good`
  loris     a connection that sends half its headers and stops: the server must close
            it after --timeout-request-read
Beside them, with --flip-every S, a knob changer (an attached EngineClient) turns the
token budget and, when the server speculates, the live k every S seconds: the good
clients' greedy tokens must not change. At the end: the engine's live requests and used
blocks (an attached client's snapshot) must be 0, and SIGTERM must stop the server (all
its API servers and the engine process) with exit code 0.

    python scripts/soak.py --server --seconds 600 --flip-every 2 \
        --serve-args "--api-server-count 2 --speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 3}'"
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from devtools.hostile_bodies import check_refusal, hostile_bodies  # noqa: E402
from devtools.procs import engine_leaks, engine_pid, proc_status  # noqa: E402

PROMPTS = ["ROMEO.\nWhat news from the court?\n\nJULIET.\n", "First Citizen:\nBefore we proceed",
           "KING HENRY.\nOnce more unto the breach", "HAMLET.\nTo be, or not to be",
           "MACBETH.\nIs this a dagger", "PORTIA.\nThe quality of mercy", "LEAR.\nBlow, winds",
           "PUCK.\nIf we shadows have offended"]
KINDS = {"good": 35, "plain": 15, "bad": 20, "cancelled": 15, "stalled": 10, "loris": 5}
READ_TIMEOUT_S = 5.0


@dataclass
class Report:
    requests: Counter = field(default_factory=Counter)   # by kind
    outcomes: Counter = field(default_factory=Counter)   # "kind:status" and failures
    problems: list[str] = field(default_factory=list)
    samples: list[tuple] = field(default_factory=list)   # (t, server MB, thr, engine MB, thr)
    refs: dict = field(default_factory=dict)             # (prompt, max_tokens) -> token ids
    loris_max_s: float = 0.0                             # longest a slow-loris was held


def flip_knobs(address: str, every: float, stop, counts: Counter) -> None:
    """Turn the token budget (and the live k where the engine speculates) every `every`
    s until `stop` is set, from an attached client, as the TUI's -/+ and d/D do."""
    from engine.front.client import EngineClient
    rng = random.Random(1)
    with EngineClient(address=address, label="soak-knobs", snapshots=False) as c:
        k = c.set_knobs().num_speculative_tokens
        while not stop.wait(every):
            changes = {"max_num_batched_tokens": rng.choice([16, 32, 64, 256, 2048])}
            if k:
                changes["num_speculative_tokens"] = rng.choice([1, 2, 3, 4])
            c.set_knobs(**changes)
            counts["knob changes"] += 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def sse_tokens(resp: httpx.Response, stall_s: float = 0.0, stop_after: int | None = None):
    """(token ids, got an error event, ended with [DONE]) of a completions stream."""
    ids, error, done, chunks = [], False, False, 0
    async for line in resp.aiter_lines():
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            done = True
            break
        msg = json.loads(line[6:])
        if "error" in msg:
            error = True
            continue
        ids += msg["choices"][0].get("token_ids") or []
        chunks += 1
        if stall_s and chunks == 1:
            await asyncio.sleep(stall_s)
        if stop_after is not None and chunks >= stop_after:
            break
    return ids, error, done


class Soak:
    def __init__(self, url: str, seconds: float, clients: int, seed: int):
        self.url, self.seconds, self.clients = url, seconds, clients
        self.rng = random.Random(seed)
        self.hostile = list(hostile_bodies(seed, 200))
        self.rep = Report()
        self.port = int(url.rsplit(":", 1)[1])

    def _check_tokens(self, key, ids: list[int], complete: bool) -> None:
        ref = self.rep.refs.setdefault(key, ids) if complete else self.rep.refs.get(key)
        if ref is not None and (ids != ref if complete else ids != ref[:len(ids)]):
            self.rep.outcomes["token-mismatch"] += 1
            self.rep.problems.append(f"mismatch {key}: {ids[:8]} vs {ref[:8]}")

    async def _stream(self, h: httpx.AsyncClient, kind: str, rng: random.Random) -> None:
        prompt, max_tokens = rng.choice(PROMPTS), rng.choice([8, 16, 32])
        body = {"model": "default", "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                "temperature": 0, "ignore_eos": True, "return_token_ids": True}
        stall = rng.uniform(1, 4) if kind == "stalled" else 0.0
        stop_after = rng.randint(1, 3) if kind == "cancelled" else None
        async with h.stream("POST", "/v1/completions", json=body) as r:
            self.rep.outcomes[f"{kind}:{r.status_code}"] += 1
            if r.status_code != 200:
                self.rep.problems.append(f"{kind}: HTTP {r.status_code}")
                return
            ids, error, done = await sse_tokens(r, stall, stop_after)
        if error:
            self.rep.outcomes[f"{kind}:error-event"] += 1
        elif kind != "cancelled" and not done:
            self.rep.outcomes[f"{kind}:no-DONE"] += 1
        self._check_tokens((prompt, max_tokens), ids, complete=kind != "cancelled" and done)

    async def _plain(self, h: httpx.AsyncClient, rng: random.Random) -> None:
        n = rng.choice([1, 2])
        if rng.random() < 0.5:
            r = await h.post("/v1/completions", json={"model": "default", "prompt": rng.choice(
                PROMPTS), "max_tokens": 8, "n": n, "seed": rng.randrange(1000)})
        else:
            r = await h.post("/v1/chat/completions", json={
                "model": "default", "max_tokens": 8, "n": n, "stop": ["\n\n"],
                "messages": [{"role": "user", "content": rng.choice(PROMPTS)}]})
        self.rep.outcomes[f"plain:{r.status_code}"] += 1
        if r.status_code != 200 or len(r.json()["choices"]) != n:
            self.rep.problems.append(f"plain: HTTP {r.status_code} {r.text[:120]}")

    async def _bad(self, h: httpx.AsyncClient, rng: random.Random) -> None:
        name, endpoint, body = rng.choice(self.hostile)
        r = await h.post(f"/v1/{endpoint}", content=body,
                         headers={"content-type": "application/json"})
        self.rep.outcomes[f"bad:{r.status_code}"] += 1
        if (wrong := check_refusal(name, r.status_code, r.headers.get("content-type", ""),
                                   r.content)) is not None:
            self.rep.outcomes["bad:wrong-answer"] += 1
            self.rep.problems.append(wrong)

    async def _loris(self, rng: random.Random) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n")
        await writer.drain()
        t0 = time.monotonic()
        try:
            data = await asyncio.wait_for(reader.read(), READ_TIMEOUT_S * 3)
            cut = data == b"" or data.startswith(b"HTTP/1.1 4")
            self.rep.outcomes["loris:cut" if cut else "loris:answered"] += 1
            self.rep.loris_max_s = max(self.rep.loris_max_s, time.monotonic() - t0)
        except asyncio.TimeoutError:
            self.rep.outcomes["loris:held"] += 1
            self.rep.problems.append("slow-loris connection held past 3x the read timeout")
        finally:
            writer.close()

    async def _client(self, i: int, deadline: float) -> None:
        rng = random.Random(self.rng.random())
        kinds, weights = list(KINDS), list(KINDS.values())
        # keep-alive shorter than the server's (5 s): no request on a connection it is closing
        limits = httpx.Limits(keepalive_expiry=2.0)
        async with httpx.AsyncClient(base_url=self.url, timeout=120, limits=limits) as h:
            while time.monotonic() < deadline:
                kind = rng.choices(kinds, weights)[0]
                self.rep.requests[kind] += 1
                try:
                    if kind in ("good", "cancelled", "stalled"):
                        await self._stream(h, kind, rng)
                    elif kind == "plain":
                        await self._plain(h, rng)
                    elif kind == "bad":
                        await self._bad(h, rng)
                    else:
                        await self._loris(rng)
                except (httpx.HTTPError, OSError) as exc:
                    self.rep.outcomes[f"{kind}:{type(exc).__name__}"] += 1
                    self.rep.problems.append(f"{kind}: {type(exc).__name__}: {exc}")

    async def run(self, sample) -> Report:
        t0 = time.monotonic()
        tasks = [asyncio.create_task(self._client(i, t0 + self.seconds))
                 for i in range(self.clients)]
        while not all(t.done() for t in tasks):
            self.rep.samples.append((round(time.monotonic() - t0), *sample()))
            await asyncio.wait(tasks, timeout=SAMPLE_EVERY_S)
        self.rep.samples.append((round(time.monotonic() - t0), *sample()))
        for t in tasks:
            t.result()
        return self.rep


SAMPLE_EVERY_S = 10.0


def start_server(port: int, address: str, extra: list[str], log) -> subprocess.Popen:
    """The server's output goes to the file `log` (a pipe nobody reads would fill up and
    block the server's logging, and with it its event loop)."""
    cmd = [sys.executable, "-m", "roseplay", "serve", "--port", str(port), "--engine-address",
           address, "--timeout-request-read", str(READ_TIMEOUT_S), "--log-level", "error",
           *extra]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"roseplay serve exited: {log.read()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("roseplay serve did not come up")
        time.sleep(0.3)


def soak_http(seconds: float, clients: int, seed: int, extra: list[str],
              flip_every: float = 0.0) -> tuple[Report, dict]:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="roseplay-soak-") as tmp, \
            open(os.path.join(tmp, "serve.log"), "w+") as log:
        address = f"ipc://{tmp}/engine"
        proc = start_server(port, address, extra, log)
        stop, flipper = threading.Event(), None
        try:
            engine = engine_pid(proc.pid)
            sample = lambda: (*proc_status(proc.pid), *proc_status(engine))  # noqa: E731
            soak = Soak(f"http://127.0.0.1:{port}", seconds, clients, seed)
            if flip_every:
                flipper = threading.Thread(target=flip_knobs, daemon=True, args=(
                    address, flip_every, stop, soak.rep.outcomes))
                flipper.start()
            rep = asyncio.run(soak.run(sample))
            stop.set()
            if flipper is not None:
                flipper.join(30)
            live, used = engine_leaks(address)
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(60)
            log.seek(0)
            end = {"live_requests": live, "used_blocks": used, "exit_code": code,
                   "engine_gone": not os.path.exists(f"/proc/{engine}"),
                   "log_lines": len(log.read().splitlines())}
        finally:
            stop.set()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return rep, end


def print_http_report(rep: Report, end: dict, seconds: float, clients: int) -> None:
    total = sum(rep.requests.values())
    print(f"soak {seconds:.0f} s through `roseplay serve` ({clients} clients): {total} requests "
          f"({', '.join(f'{k} {v}' for k, v in sorted(rep.requests.items()))})")
    print("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(rep.outcomes.items()) if v))
    print(f"slow-loris connections held at most {rep.loris_max_s:.1f} s "
          f"(--timeout-request-read {READ_TIMEOUT_S:g})")
    print(f"problems: {len(rep.problems)}" + "".join(f"\n  {p}" for p in rep.problems[:10]))
    print(f"at the end: leaked states {end['live_requests']} (live requests in the engine), "
          f"used blocks {end['used_blocks']}; SIGTERM exit code {end['exit_code']}, engine "
          f"process gone {end['engine_gone']}; {end['log_lines']} lines of server log")
    print(f"{'t (s)':>6} {'server RSS MB':>14} {'threads':>8} {'engine RSS MB':>14} {'threads':>8}")
    step = max(1, len(rep.samples) // 12)
    rows = rep.samples[::step] + ([rep.samples[-1]] if (len(rep.samples) - 1) % step else [])
    for s in rows:
        print(f"{s[0]:6d} {s[1]:14.1f} {s[2]:8d} {s[3]:14.1f} {s[4]:8d}")


def ok(rep: Report, end: dict) -> bool:
    return (not rep.problems and end["live_requests"] == 0 and end["used_blocks"] == 0
            and end["exit_code"] == 0 and end["engine_gone"])
