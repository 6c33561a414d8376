"""The load of `roseplay bench --base-url`: one asyncio client, or `--num-clients N`
processes of them sharing one report (a ClientPool, alive for the whole bench).

One Python process reads some tens of thousands of SSE events per second; a GPU engine
streams more (W1: ~65k tokens/s), so the load splits over processes: request i goes to
process i % N, each keeps its share of --max-concurrency, all start together (a
barrier) and follow the one arrival schedule. Their perf_counter clocks are the host's
monotonic clock, so their records merge into one run. Each reports its CPU time:
a client process near 1 core is the limit, not the server (docs/SERVE.md "Performance").
"""
from __future__ import annotations

import asyncio
import math
import multiprocessing as mp
import queue
import signal
import time
from dataclasses import dataclass

import httpx

from roseplay.bench.sse import Outcome, send

TIMEOUT_S = 6 * 3600
JOIN_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0      # a stopped client process's share comes back within it


@dataclass
class Job:
    """One client's share of a run (everything picklable: workers import no engine)."""
    base_url: str
    path: str
    headers: dict
    requests: list[tuple[int, dict, int | None]]    # (index, body, prompt length)
    offsets: list[float]                            # arrival offsets, by request
    max_concurrency: int


@dataclass
class ClientLoad:
    """What the client processes spent on a run."""
    processes: int
    cpu_s: float           # user + system CPU of all client processes
    wall_s: float          # the longest client's wall time
    max_util: float        # the busiest process's CPU / its wall (1.0 = one core saturated)
    chunks: int = 0        # SSE chunks carrying output

    def as_dict(self) -> dict:
        return {"processes": self.processes, "cpu_s": self.cpu_s, "wall_s": self.wall_s,
                "cores": self.cpu_s / self.wall_s if self.wall_s else 0.0,
                "max_process_util": self.max_util, "chunks": self.chunks,
                "chunks_per_s": self.chunks / self.wall_s if self.wall_s else 0.0}


class LoadInterrupted(Exception):
    """Ctrl-C during a load: `outcomes`, the requests that finished before it (this
    process's, or what each client process sends back as it stops)."""

    def __init__(self, outcomes: list[Outcome]):
        super().__init__("interrupted")
        self.outcomes = outcomes


async def drive(job: Job, on_done=None, ready=None, finished: list | None = None
                ) -> tuple[list[Outcome], float, float]:
    """The job's outcomes, and the CPU and wall time from the first arrival to the last
    answer (connection pool set-up and tear-down left out). ready(): called once the
    client is built, just before the first arrival (client processes meet there).
    `finished` gets each outcome as it comes (what an interrupted run keeps)."""
    slots = asyncio.Semaphore(job.max_concurrency)
    limits = httpx.Limits(max_connections=job.max_concurrency,
                          max_keepalive_connections=job.max_concurrency)
    async with httpx.AsyncClient(base_url=job.base_url.rstrip("/"), headers=job.headers,
                                 limits=limits, timeout=TIMEOUT_S) as http:
        if ready is not None:
            ready()
        t0, cpu0 = time.perf_counter(), time.process_time()

        async def one(index: int, body: dict, prompt_len: int | None) -> Outcome:
            await asyncio.sleep(max(0.0, t0 + job.offsets[index] - time.perf_counter()))
            async with slots:
                out = await send(http, job.path, body, index, prompt_len)
            if finished is not None:
                finished.append(out)
            if on_done:
                on_done()
            return out
        outcomes = await asyncio.gather(*(one(*r) for r in job.requests))
        return outcomes, time.process_time() - cpu0, time.perf_counter() - t0



def run_loop(coro):
    """Run the client's event loop: uvloop's when installed (uvicorn picks it for the server
    the same way), since the client's per-chunk work is event-loop work."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)

async def _stoppable(job: Job, tick, ready, finished: list) -> tuple[list[Outcome], float, float]:
    """drive(), cancelled by SIGTERM (the parent's stop on Ctrl-C) through the event loop:
    an exception raised by a plain signal handler can land in a transport's write, which
    takes it for a broken socket and runs on."""
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)
    try:
        return await drive(job, tick, ready, finished)
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def _worker(inbox, barrier, done, results) -> None:
    """A client process: for each job (None: stop), build its HTTP client, wait for the
    others, run its share, send back what it saw. It lives for the whole bench, so the
    warm-up also warms it (lazy imports, first-call code paths). Ctrl-C is the parent's
    to handle (the terminal sends it to the whole group): the parent's SIGTERM stops a
    run, and the requests that finished go back as ("stopped", outcomes)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def tick():
        with done.get_lock():
            done.value += 1
    while (job := inbox.get()) is not None:    # (SIGTERM here: nothing to send back)
        finished: list[Outcome] = []
        try:
            results.put(run_loop(_stoppable(job, tick, lambda: barrier.wait(JOIN_TIMEOUT_S),
                                            finished)))
        except asyncio.CancelledError:
            results.put(("stopped", finished))
            return
        except BaseException as exc:      # the parent must hear of it, not wait forever
            results.put(exc)


def split(job: Job, n: int) -> list[Job]:
    """Request i to client i % n; each client its share of the concurrency cap."""
    cap = math.ceil(job.max_concurrency / n)
    return [Job(job.base_url, job.path, job.headers, job.requests[k::n], job.offsets, cap)
            for k in range(n)]


def run_load(job: Job, pool: "ClientPool | None" = None, on_progress=None
             ) -> tuple[list[Outcome], ClientLoad]:
    """Run `job` from this process (no pool) or the pool's processes; outcomes in
    request order. on_progress(n finished) is called from this process."""
    if pool is None:
        count = [0]

        def tick():
            count[0] += 1
            if on_progress:
                on_progress(count[0])
        finished: list[Outcome] = []
        try:
            outcomes, cpu, wall = run_loop(drive(job, tick, finished=finished))
        except KeyboardInterrupt:
            raise LoadInterrupted(sorted(finished, key=lambda o: o.index)) from None
        load = ClientLoad(1, cpu, wall, cpu / wall if wall else 0.0)
    else:
        try:
            outcomes, load = pool.run(job, on_progress)
        except KeyboardInterrupt:
            raise LoadInterrupted(sorted(pool.stop(), key=lambda o: o.index)) from None
    outcomes.sort(key=lambda o: o.index)
    load.chunks = sum(len(o.times) for o in outcomes)
    return outcomes, load


class ClientPool:
    """N spawned client processes for the whole bench (warm-up and every run)."""

    def __init__(self, n: int):
        ctx = mp.get_context("spawn")      # no fork of a process with threads and sockets
        self.n = n
        self._barrier, self._done, self._results = ctx.Barrier(n), ctx.Value("i", 0), ctx.Queue()
        self._inboxes = [ctx.Queue() for _ in range(n)]
        self._procs = [ctx.Process(target=_worker, daemon=True, name=f"roseplay-bench-client-{k}",
                                   args=(q, self._barrier, self._done, self._results))
                       for k, q in enumerate(self._inboxes)]
        for p in self._procs:
            p.start()

    def run(self, job: Job, on_progress=None) -> tuple[list[Outcome], ClientLoad]:
        with self._done.get_lock():
            self._done.value = 0
        for inbox, share in zip(self._inboxes, split(job, self.n)):
            inbox.put(share)
        self._got = got = []        # what stop() keeps of a run cut short
        while len(got) < self.n:
            try:
                got.append(self._results.get(timeout=0.1))
            except queue.Empty:
                if not all(p.is_alive() for p in self._procs):
                    raise RuntimeError("a bench client process died") from None
            if on_progress:
                on_progress(self._done.value)
        errors = [g for g in got if isinstance(g, BaseException)]
        if errors:
            raise RuntimeError(f"bench client process failed: {errors[0]!r}")
        outcomes = [o for g in got for o in g[0]]
        load = ClientLoad(self.n, sum(g[1] for g in got), max(g[2] for g in got),
                          max(g[1] / g[2] for g in got if g[2]))
        return outcomes, load

    def stop(self) -> list[Outcome]:
        """Ctrl-C: stop the client processes (SIGTERM: each sends back the requests it saw
        finish, then exits) and return those outcomes; a process that does not answer
        within STOP_TIMEOUT_S is killed and its share is lost."""
        got = getattr(self, "_got", [])
        for p in self._procs:
            if p.is_alive():
                p.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while len(got) < self.n and time.monotonic() < deadline:
            try:
                got.append(self._results.get(timeout=0.1))
            except queue.Empty:
                if not any(p.is_alive() for p in self._procs):
                    break
        for p in self._procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(5)
        outcomes = []
        for g in got:
            if isinstance(g, tuple) and g and g[0] == "stopped":
                outcomes += g[1]
            elif isinstance(g, tuple):          # a share that ended before the Ctrl-C
                outcomes += g[0]
        return outcomes

    def close(self) -> None:
        for inbox in self._inboxes:
            inbox.put(None)
        for p in self._procs:
            p.join(JOIN_TIMEOUT_S)
            if p.is_alive():
                p.terminate()
                p.join(5)

    def __enter__(self) -> "ClientPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
