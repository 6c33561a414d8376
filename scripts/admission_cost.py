"""Admission cost: the API server's CPU per request when N requests arrive at once.

Starts `roseplay serve` (engine in its own process), opens N keep-alive connections and,
each round, sends one streamed /v1/completions (max_tokens 1, a token-id prompt, as
`bench --base-url` sends) on every connection at the same moment. Reports the API-server
process's CPU per request (user + system, from /proc), its event loop's (the main
thread's: admission's critical path), the engine's, and the burst's wall
time and time to first byte, median (min..max) over the rounds after a warm-up round.
The client is raw asyncio sockets, so its own cost stays small next to the server's.

    python scripts/admission_cost.py --model dummy:tiny --requests 256 --rounds 5
    python scripts/admission_cost.py --spy /tmp/adm.txt      (py-spy the server; top frames)
    python scripts/admission_cost.py --spy /tmp/adm.txt --native    (C frames too: the GC)
    python scripts/admission_cost.py --serve-args --http h11    (the other HTTP parser)
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from roseplay.serve.server import bind  # noqa: E402
from devtools.procs import children  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
END = b"0\r\n\r\n"                    # the last chunk of a chunked (streamed) response


def cpu_s(pid: int, thread: int | None = None) -> float:
    """CPU seconds of a process (all threads), or of one of its threads."""
    path = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def start_server(args) -> tuple[subprocess.Popen, int]:
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen([sys.executable, "-m", "roseplay", "serve", "--model", args.model,
                             "--port", str(port), "--log-level", "warning",
                             "--max-num-seqs", str(max(args.requests, 16)),
                             # a slow burst on a loaded box leaves early connections idle
                             # past the 5 s default; the server would close them
                             "--timeout-keep-alive", "120", *args.serve_args],
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError("roseplay serve exited:\n" + log.read()[-2000:])
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return proc, port
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("roseplay serve did not come up")


def request_bytes(args, rng: random.Random) -> bytes:
    body = json.dumps({"model": args.model, "prompt": [rng.randrange(3, args.vocab)
                                                       for _ in range(args.input_len)],
                       "max_tokens": 1, "temperature": 0.0, "ignore_eos": True,
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


async def one(conn, payload: bytes, t0: float) -> tuple[float, float]:
    reader, writer = conn
    writer.write(payload)
    first, buf = None, b""
    while not buf.endswith(END):
        data = await reader.read(65536)
        if not data:
            raise RuntimeError("the server closed the connection")
        if first is None:
            first = time.perf_counter()
            if not data.startswith(b"HTTP/1.1 200 "):
                raise RuntimeError(data[:300].decode(errors="replace"))
        buf = buf[-8:] + data
    return first - t0, time.perf_counter() - t0


async def run_rounds(args, pids: tuple[int, int]) -> list[dict]:
    rng = random.Random(0)
    conns = [await asyncio.open_connection("127.0.0.1", args.port) for _ in range(args.requests)]
    results = []
    try:
        for r in range(args.rounds + 1):
            payloads = [request_bytes(args, rng) for _ in conns]   # fresh prompts: no cache hits
            before = [cpu_s(p) for p in pids]
            loop_before = cpu_s(pids[0], pids[0])    # the main thread: the event loop
            t0 = time.perf_counter()
            times = await asyncio.gather(*(one(c, p, t0) for c, p in zip(conns, payloads)))
            wall = time.perf_counter() - t0
            await asyncio.sleep(0.3)          # the engine's last step and stats settle
            server, engine = (cpu_s(p) - b for p, b in zip(pids, before))
            loop = cpu_s(pids[0], pids[0]) - loop_before
            if r:                            # round 0 warms up
                results.append({"server_ms_per_req": 1000 * server / args.requests,
                                "loop_ms_per_req": 1000 * loop / args.requests,
                                "engine_ms_per_req": 1000 * engine / args.requests,
                                "burst_ms": 1000 * wall,
                                "ttfb_p50_ms": 1000 * statistics.median(t[0] for t in times)})
    finally:
        for _, w in conns:
            w.close()
    return results


def spy_top(raw_path: str, n: int = 25) -> list[str]:
    """The frames with the most samples (inclusive) in py-spy's raw output."""
    incl, total = collections.Counter(), 0
    with open(raw_path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            total += int(count)
            for frame in set(stack.split(";")):
                incl[frame] += int(count)
    return [f"{100 * c / max(total, 1):5.1f}%  {fr}" for fr, c in incl.most_common(n)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="dummy:tiny")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=256, help="token ids are drawn below this")
    ap.add_argument("--spy", metavar="PATH", help="py-spy the API server into PATH (raw)")
    ap.add_argument("--native", action="store_true", help="with --spy: C frames too")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--serve-args", nargs=argparse.REMAINDER, default=[])
    args = ap.parse_args(argv)
    proc, args.port = start_server(args)
    spy = None
    try:
        pids = (proc.pid, children(proc.pid)[0])
        if args.spy:
            # --native shows C frames (the garbage collector); it cannot run nonblocking
            mode = ["--native"] if args.native else ["--nonblocking"]
            spy = subprocess.Popen([os.environ.get("PY_SPY", "py-spy"), "record", "-p",
                                    str(proc.pid), "-r", "250", "-f", "raw", "-o", args.spy,
                                    *mode], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
            time.sleep(1.0)
        results = asyncio.run(run_rounds(args, pids))
    finally:
        if spy is not None:
            spy.send_signal(2)
            spy.wait(30)
        proc.send_signal(2)
        proc.wait(60)
    summary = {k: {"median": statistics.median(r[k] for r in results),
                   "min": min(r[k] for r in results), "max": max(r[k] for r in results)}
               for k in results[0]}
    print(f"{args.requests} requests at once x {args.rounds} rounds, {args.model}, "
          f"serve {' '.join(args.serve_args) or '(defaults)'}:")
    for k, v in summary.items():
        print(f"  {k:18s} {v['median']:8.3f} ({v['min']:.3f}..{v['max']:.3f})")
    if args.spy:
        print("\n".join(spy_top(args.spy)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": sys.argv[1:], "rounds": results, "summary": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
