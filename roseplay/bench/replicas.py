"""A data-parallel bench's figures per replica (`roseplay bench --data-parallel-size N`):
what the router sent each replica and how each served it, from the run's request records
(placed by DPClient.replica_of) and each replica's snapshots before and after the run."""
from __future__ import annotations

from rich.console import Console

from engine.metrics import Summary, prefix_hit_rate


def replica_figures(loop, records: list[dict], snaps0: list, snaps1: list,
                    duration: float) -> dict:
    """Per replica: requests, output tokens and tok/s, TTFT p50/p99 (ms), prefix hit rate,
    steps; with the policy and the imbalance (most requests / mean)."""
    rows = []
    for r, (s0, s1) in enumerate(zip(snaps0, snaps1)):
        mine = [x for x in records if loop.replica_of(x["request_id"]) == r]
        c = s1.counters.minus(s0.counters)
        ttft = Summary.of(x["ttft"] for x in mine)
        out = sum(x["output_len"] for x in mine)
        rows.append({"engine": r, "alive": loop.alive(r), "requests": len(mine),
                     "output_tokens": out,
                     "output_throughput": out / duration if duration else 0.0,
                     "ttft_p50_ms": ttft.p50 * 1e3, "ttft_p99_ms": ttft.p99 * 1e3,
                     "prefix_hit_rate": prefix_hit_rate(c.prefix_hit_tokens,
                                                        c.prefix_queried_tokens) or 0.0,
                     "steps": c.steps})
    counts = [row["requests"] for row in rows]
    mean = sum(counts) / len(counts) if counts else 0
    return {"routing_policy": loop.router.policy, "replicas": rows,
            "imbalance": max(counts) / mean if mean else 0.0}


def print_replicas(console: Console, figures: dict, w: int) -> None:
    console.print("{s:{c}^{n}}".format(s=f" Replicas ({figures['routing_policy']}) ", n=w,
                                       c="-"))
    console.print(f"{'engine':<7}{'reqs':>6}{'tok/s':>10}{'TTFT p50':>10}{'p99 ms':>9}"
                  f"{'hit %':>8}", highlight=False)
    for row in figures["replicas"]:
        dead = "" if row["alive"] else " (dead)"
        console.print(f"{row['engine']:<7}{row['requests']:>6}{row['output_throughput']:>10.1f}"
                      f"{row['ttft_p50_ms']:>10.1f}{row['ttft_p99_ms']:>9.1f}"
                      f"{100 * row['prefix_hit_rate']:>8.1f}{dead}", highlight=False)
    console.print(f"{'Imbalance (most requests / mean):':<40} {figures['imbalance']:>10.2f}",
                  highlight=False)
