"""Soak the engine *process* (EngineClient, not in-process) under churn and watch its
memory and threads.

A small KV pool (forced preemption and eviction), up to --in-flight requests of short
random prompts (a third repeat an earlier prompt), random cancels, and every
--flip-every seconds a live knob flip (max_num_seqs, max_num_batched_tokens, prefix
caching) or a prefix-cache clear. Every --sample-every seconds the engine process's RSS
and thread count (and this client's) are read from /proc. Checks: every request ends,
none with an error; a repeated greedy prompt gives the same tokens every time it
finishes (a cancelled one: a prefix of them); at the end every block is free. The CI
test (tests/engine/ipc/test_soak_process.py) runs it for ~20 s; for a longer run:

    python scripts/soak.py --seconds 180

`--server` soaks `roseplay serve` through HTTP instead (scripts/soak_http.py: good, bad,
cancelled, stalled and slow-loris clients; docs/RELIABILITY.md has a 10-minute run):

    python scripts/soak.py --server --seconds 600 --clients 24
"""
from __future__ import annotations

import argparse
import os
import queue
import random
import shlex
import sys
import time
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine import SamplingParams  # noqa: E402
from engine.front.client import EngineClient  # noqa: E402
from devtools.procs import proc_status  # noqa: E402

ENGINE = dict(model="dummy:tiny", device="cpu", dtype="float32", block_size=4, num_blocks=24,
              max_model_len=64)
VOCAB = 512


@dataclass
class SoakResult:
    samples: list[tuple] = field(default_factory=list)   # (t, engine MB, threads, client MB, threads)
    submitted: int = 0
    finished: int = 0
    cancelled: int = 0
    errors: list[str] = field(default_factory=list)
    mismatches: int = 0
    flips: int = 0
    clears: int = 0
    counters: object = None
    all_free: bool = False


class Soak:
    def __init__(self, client, seconds: float, in_flight: int, flip_every: float,
                 sample_every: float, seed: int):
        self.client, self.seconds, self.in_flight = client, seconds, in_flight
        self.flip_every, self.sample_every = flip_every, sample_every
        self.rng = random.Random(seed)
        self.done: queue.SimpleQueue = queue.SimpleQueue()
        self.live: dict[str, tuple] = {}          # request id -> (key, stream)
        self.seen: dict[tuple, list[int]] = {}    # (prompt, max_tokens) -> greedy tokens
        self.keys: list[tuple] = []
        self.res = SoakResult()

    def _new_key(self) -> tuple:
        if self.keys and self.rng.random() < 0.33:
            return self.rng.choice(self.keys)
        prompt = tuple(self.rng.randrange(VOCAB) for _ in range(self.rng.randint(1, 22)))
        key = (prompt, self.rng.randint(1, 16))
        self.keys.append(key)
        if len(self.keys) > 200:          # bounded: the client's RSS is measured too
            self.seen.pop(self.keys.pop(0), None)
        return key

    def _submit(self) -> None:
        key = self._new_key()
        rid = f"soak-{self.res.submitted}"
        self.res.submitted += 1
        sp = SamplingParams(max_tokens=key[1], temperature=0, ignore_eos=True)
        stream = self.client.submit({"prompt_token_ids": list(key[0])}, sp, request_id=rid,
                                    on_finish=self.done.put)
        self.live[rid] = (key, stream)
        if self.rng.random() < 0.1:
            self.client.cancel(rid)

    def _collect(self, event) -> None:
        key, _ = self.live.pop(event.request_id)
        out = event.output
        if event.error is not None or out is None or out.error is not None:
            self.res.errors.append(event.error or (out and out.error) or "no output")
            return
        tokens = list(out.outputs[0].token_ids)
        ref = self.seen.get(key)
        if out.outputs[0].finish_reason == "cancelled":
            self.res.cancelled += 1
            self.res.mismatches += ref is not None and tokens != ref[:len(tokens)]
            return
        self.res.finished += 1
        if ref is None:
            self.seen[key] = tokens
        else:
            self.res.mismatches += tokens != ref

    def _flip(self) -> None:
        r = self.rng.random()
        if r < 0.2:
            self.client.reset_prefix_cache()
            self.res.clears += 1
            return
        if r < 0.5:
            self.client.set_knobs(max_num_seqs=self.rng.randint(1, 16))
        elif r < 0.8:
            self.client.set_knobs(max_num_batched_tokens=self.rng.choice([8, 16, 32, 64, 128]))
        else:
            self.client.set_knobs(enable_prefix_caching=self.rng.random() < 0.5)
        self.res.flips += 1

    def _sample(self, t: float) -> None:
        eng = proc_status(self.client.proc.pid)
        me = proc_status(os.getpid())
        self.res.samples.append((round(t, 1), *eng, *me))

    def run(self) -> SoakResult:
        t0 = time.monotonic()
        next_flip = next_sample = t0
        while (now := time.monotonic()) - t0 < self.seconds:
            while len(self.live) < self.in_flight:
                self._submit()
            try:
                self._collect(self.done.get(timeout=0.05))
                while True:
                    self._collect(self.done.get_nowait())
            except queue.Empty:
                pass
            if now >= next_flip:
                self._flip()
                next_flip = now + self.flip_every
            if now >= next_sample:
                self._sample(now - t0)
                next_sample = now + self.sample_every
        self._drain()
        self._sample(time.monotonic() - t0)
        return self.res

    def _drain(self) -> None:
        deadline = time.monotonic() + 60
        while self.live and time.monotonic() < deadline:
            try:
                self._collect(self.done.get(timeout=1.0))
            except queue.Empty:
                pass
        if self.live:
            self.res.errors.append(f"{len(self.live)} requests never ended")
        self.client.reset_prefix_cache()
        self.client.wait_idle(30)
        snap = self.client.snapshot()
        self.res.counters = snap.counters
        self.res.all_free = snap.num_free == snap.num_blocks


def soak(seconds: float = 20.0, in_flight: int = 24, flip_every: float = 0.25,
         sample_every: float = 1.0, seed: int = 0, device: str = "cpu") -> SoakResult:
    with EngineClient(label="soak", **{**ENGINE, "device": device}) as client:
        return Soak(client, seconds, in_flight, flip_every, sample_every, seed).run()


def flatness(res: SoakResult, warmup_fraction: float = 1 / 3) -> dict:
    """Engine RSS and threads after warm-up: first, last, min, max."""
    after = res.samples[int(len(res.samples) * warmup_fraction):]
    rss = [s[1] for s in after]
    threads = [s[2] for s in after]
    return {"rss_first": rss[0], "rss_last": rss[-1], "rss_min": min(rss), "rss_max": max(rss),
            "threads_min": min(threads), "threads_max": max(threads)}


def print_report(res: SoakResult, seconds: float) -> None:
    c = res.counters
    print(f"soak {seconds:.0f} s through the engine process: {res.submitted} requests, "
          f"{res.finished} finished, {res.cancelled} cancelled, {len(res.errors)} errors, "
          f"{res.mismatches} token mismatches; {res.flips} knob flips, {res.clears} cache "
          f"clears; engine: {c.steps} steps, {c.preemptions} preemptions, {c.evictions} "
          f"evictions, {c.prefix_hits} prefix hits; all blocks free at the end: {res.all_free}")
    print(f"{'t (s)':>7} {'engine RSS MB':>14} {'threads':>8} {'client RSS MB':>14} {'threads':>8}")
    step = max(1, len(res.samples) // 12)
    for s in res.samples[::step] + ([res.samples[-1]] if len(res.samples) % step != 1 else []):
        print(f"{s[0]:7.1f} {s[1]:14.1f} {s[2]:8d} {s[3]:14.1f} {s[4]:8d}")
    f = flatness(res)
    print(f"after warm-up (last 2/3): engine RSS {f['rss_first']:.1f} -> {f['rss_last']:.1f} MB "
          f"(min {f['rss_min']:.1f}, max {f['rss_max']:.1f}), threads {f['threads_min']}..{f['threads_max']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=180.0)
    p.add_argument("--in-flight", type=int, default=24)
    p.add_argument("--flip-every", type=float, default=0.25)
    p.add_argument("--sample-every", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="cuda: the same tiny model and churn on the GPU (graphs, async steps)")
    p.add_argument("--server", action="store_true",
                   help="soak `roseplay serve` over HTTP (scripts/soak_http.py)")
    p.add_argument("--clients", type=int, default=24, help="--server: concurrent clients")
    p.add_argument("--serve-args", default="",
                   help="--server: more `roseplay serve` flags (one shell-quoted string)")
    a = p.parse_args(argv)
    if a.server:
        return _soak_server(a)
    res = soak(a.seconds, a.in_flight, a.flip_every, a.sample_every, a.seed, a.device)
    print_report(res, a.seconds)
    return 0 if not res.errors and not res.mismatches and res.all_free else 1


def _soak_server(a) -> int:
    from scripts.soak_http import ok, print_http_report, soak_http
    extra = (["--device", a.device] if a.device != "cpu" else []) + shlex.split(a.serve_args)
    rep, end = soak_http(a.seconds, a.clients, a.seed, extra, a.flip_every)
    print_http_report(rep, end, a.seconds, a.clients)
    return 0 if ok(rep, end) else 1


if __name__ == "__main__":
    raise SystemExit(main())
