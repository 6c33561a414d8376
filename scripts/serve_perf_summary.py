"""The summary of scripts/gpu_serve.sh: direct vs HTTP (median of the runs, min..max,
the client's CPU), the server's and engine's CPU, the server's own latency means next
to the client's, the load client's ceiling, the admission cost and the server's py-spy
top frames.

    python scripts/serve_perf_summary.py OUT_DIR
"""
from __future__ import annotations

import collections
import json
import os
import statistics
import sys


def load(out: str, name: str) -> dict | None:
    path = os.path.join(out, name + ".json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def spread(xs: list[float], fmt: str = "{:,.0f}") -> str:
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}..{fmt.format(max(xs))})"


def row(label: str, data: dict | None) -> tuple[str, float | None, float | None]:
    if data is None:
        return f"| {label} | (missing) | | | |", None, None
    runs = data["runs"]
    tput = [r["summary"]["output_throughput"] for r in runs]
    ttft = [r["summary"]["ttft_ms"]["median"] for r in runs]
    clients = [r["client"] for r in runs if "client" in r]
    client = (f"{spread([c['cores'] for c in clients], '{:.2f}')} cores, busiest "
              f"{100 * max(c['max_process_util'] for c in clients):.0f} %, "
              f"{clients[0]['processes']} proc" if clients else "(in-process driver)")
    chunks = (spread([c["chunks_per_s"] for c in clients]) if clients else "")
    return (f"| {label} | {spread(tput)} | {spread(ttft, '{:.1f}')} | {client} | {chunks} |",
            statistics.median(tput), statistics.median(ttft))


def server_cpu(out: str) -> str:
    path = os.path.join(out, "server_cpu.txt")
    if not os.path.exists(path):
        return ""
    lines = [ln.split() for ln in open(path) if ln.strip()]
    if len(lines) < 2:
        return ""
    (_, t0, *a), (_, t1, *b) = lines[:2]
    wall = float(t1) - float(t0)
    before = dict(zip(a[::2], map(float, a[1::2])))
    after = dict(zip(b[::2], map(float, b[1::2])))
    parts = [f"pid {p}: {(after[p] - before.get(p, 0)) / wall:.2f} cores"
             for p in after if p in before]
    return (f"CPU over the HTTP W1 step ({wall:.0f} s incl. warm-up; first pid = the "
            f"server, then the engine): " + ", ".join(parts))


IDLE_FRAMES = ("EpollSelector.select", "Poller.poll", "Condition.wait", "Event.wait")


def spy_top(out: str, n: int = 15) -> list[str]:
    """The busiest frames (own time; threads waiting in select/poll left out)."""
    path = os.path.join(out, "server_spy.txt")
    if not os.path.exists(path):
        return []
    own, total = collections.Counter(), 0
    for line in open(path):
        stack, _, count = line.rstrip().rpartition(" ")
        if not count.isdigit():
            continue
        frame = stack.split(";")[-1]
        if frame.startswith(IDLE_FRAMES):
            continue
        total += int(count)
        own[frame] += int(count)
    return [f"  {100 * c / total:5.1f} %  {frame[:120]}" for frame, c in own.most_common(n)]


def main(out: str) -> int:
    print("| path | output tok/s median (min..max) | TTFT p50 ms median (min..max) | "
          "client CPU | client SSE chunks/s |\n|---|---|---|---|---|")
    figures = {}
    for name, label in (("direct_w1", "W1 direct (engine process)"),
                        ("http_w1", "W1 HTTP (serve + bench --base-url)"),
                        ("http_w1_one_client", "W1 HTTP, one client process"),
                        ("direct_closed", "closed loop direct"),
                        ("http_closed", "closed loop HTTP")):
        line, tput, ttft = row(label, load(out, name))
        figures[name] = (tput, ttft)
        print(line)
    for http, direct in (("http_w1", "direct_w1"), ("http_closed", "direct_closed")):
        (ht, hf), (dt, df) = figures[http], figures[direct]
        if ht and dt:
            print(f"\n{http}: {100 * ht / dt:.1f} % of the direct throughput; TTFT p50 "
                  f"x{hf / df:.2f} of the direct one" if df else "")
    http = load(out, "http_w1")
    if http and http.get("server_means_ms"):
        s, c = http["server_means_ms"], http["summary"]
        print("\nserver's own means, last HTTP W1 run (ms; client's in brackets): " + ", ".join(
            f"{k.upper()} {v:.2f} ({c[k + '_ms']['mean']:.2f})" for k, v in s.items()))
    print("\n" + server_cpu(out))
    ceiling = load(out, "ceiling")
    if ceiling:
        print("\nclient ceiling (canned tokens, 1 token/chunk, no engine): " + "; ".join(
            f"{r['num_clients']} proc: {r['output_tok_s']:,.0f} tok/s, client "
            f"{r['client_cores']:.2f} cores" for r in ceiling))
    for parser in ("httptools", "h11"):
        adm = load(out, "admission_" + parser)
        if adm:
            print(f"\nadmission, serve --http {parser} (scripts/admission_cost.py, 256 at once, "
                  "median (min..max) of the rounds): " + ", ".join(
                      f"{k} {v['median']:.3f} ({v['min']:.3f}..{v['max']:.3f})"
                      for k, v in adm["summary"].items()))
    top = spy_top(out)
    if top:
        print("\nserver py-spy, own time of the busiest frames (all threads, waits in "
              "select/poll left out):\n" + "\n".join(top))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
