"""The load client's ceiling: `roseplay bench --base-url` against scripts/canned_server.py
(canned tokens, no engine), printing SSE chunks/s, output tokens/s and the client's CPU.
A client must stream faster than the engine it measures (docs/SERVE.md "Performance").

    python scripts/client_ceiling.py --num-prompts 256 --output-len 128 --num-clients 1 2 4
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
START_TIMEOUT_S = 30


def start_canned(workers: int, tokens_per_chunk: int) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "canned_server.py"),
                             "--port", "0", "--workers", str(workers),
                             "--tokens-per-chunk", str(tokens_per_chunk)],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()        # "listening PORT" once it accepts
    if not line.startswith("listening "):
        proc.kill()
        proc.wait()
        raise RuntimeError(f"canned server did not start: {line!r}")
    return proc, int(line.split()[1])


def measure(port: int, args, num_clients: int) -> dict:
    from roseplay.bench import inproc as bench
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ceiling.json")
        rc = bench.main(["--base-url", f"http://127.0.0.1:{port}", "--model", "dummy:tiny",
                         "--num-prompts", str(args.num_prompts), "--input-len", "8",
                         "--output-len", str(args.output_len), "--warmup", "4",
                         "--repeat", str(args.repeat), "--num-clients", str(num_clients),
                         "--no-progress", "--json", path])
        if rc != 0:
            raise RuntimeError(f"bench failed (rc {rc})")
        with open(path) as f:
            data = json.load(f)
    runs = data["runs"]
    best = max(runs, key=lambda r: r["summary"]["output_throughput"])
    return {"num_clients": num_clients, "output_tok_s": best["summary"]["output_throughput"],
            "chunks_per_s": best["client"]["chunks_per_s"], "client_cores": best["client"]["cores"],
            "busiest_process_util": best["client"]["max_process_util"],
            "runs_tok_s": [r["summary"]["output_throughput"] for r in runs]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--num-prompts", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--num-clients", type=int, nargs="+", default=[1])
    ap.add_argument("--server-workers", type=int, default=1)
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    proc, port = start_canned(args.server_workers, args.tokens_per_chunk)
    try:
        rows = [measure(port, args, n) for n in args.num_clients]
    finally:
        proc.terminate()
        proc.wait(10)
    print(f"client ceiling vs canned server ({args.server_workers} worker(s), "
          f"{args.tokens_per_chunk} token(s)/chunk), {args.num_prompts} x {args.output_len} "
          f"tokens, best of {args.repeat}:")
    for r in rows:
        print(f"  --num-clients {r['num_clients']}: {r['output_tok_s']:,.0f} tok/s, "
              f"{r['chunks_per_s']:,.0f} chunks/s, client {r['client_cores']:.2f} cores "
              f"(busiest process {100 * r['busiest_process_util']:.0f} %)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
