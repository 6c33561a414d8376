"""`roseplay bench --base-url` against a data-parallel server: each replica's figures from
what the server says before and after a run. Its /metrics labels every series with the
engine that served it (label `engine`, as vLLM's: `roseplay serve --data-parallel-size N`
and vLLM's own DP servers both do); `roseplay serve`'s GET /routing adds the policy,
which replicas live and what the router sent each. A server whose /metrics names one
engine (or none) gets no rows. The rows have the in-process bench's shape
(roseplay/bench/replicas.py), so one printer shows both; TTFT percentiles come from the
server's histogram buckets (Prometheus' histogram_quantile), the rest from counters.
"""
from __future__ import annotations

import math

import httpx

from engine.kv_metrics import Histogram

SUCCESS = "vllm:request_success_total"                   # front: finished, every reason
OUTPUT_SUM = "vllm:request_generation_tokens_sum"        # front: output tokens finished
QUERIES, HITS = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"
TTFT = "vllm:time_to_first_token_seconds"
WANTED = {SUCCESS, OUTPUT_SUM, QUERIES, HITS}


def scrape(base_url: str, headers: dict) -> dict:
    """{"engines": {engine: {series: value, "ttft": {le: cumulative count}}}, "routing":
    /routing's JSON or None}; empty engines when /metrics cannot be read."""
    from prometheus_client.parser import text_string_to_metric_families
    base = base_url.rstrip("/")
    engines: dict[str, dict] = {}
    try:
        text = httpx.get(base + "/metrics", headers=headers, timeout=10).text
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                engine = s.labels.get("engine")
                if engine is None:
                    continue
                row = engines.setdefault(engine, {"ttft": {}})
                if s.name in WANTED:
                    row[s.name] = row.get(s.name, 0.0) + s.value
                elif s.name == TTFT + "_bucket":
                    le = float(s.labels["le"])
                    row["ttft"][le] = row["ttft"].get(le, 0.0) + s.value
    except Exception:       # no /metrics, or not Prometheus text: no rows
        engines = {}
    return {"engines": engines, "routing": _routing(base, headers)}


def _routing(base: str, headers: dict) -> dict | None:
    try:
        r = httpx.get(base + "/routing", headers=headers, timeout=10)
        return r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def _ttft(before: dict, after: dict) -> Histogram:
    """The run's TTFT histogram (cumulative buckets -> per-bucket counts)."""
    bounds = sorted(after)
    cum = [after[b] - before.get(b, 0.0) for b in bounds]
    counts = [int(c - (cum[i - 1] if i else 0.0)) for i, c in enumerate(cum)]
    finite = [b for b in bounds if math.isfinite(b)]
    if len(finite) == len(bounds):
        counts.append(0)
    return Histogram(tuple(finite), tuple(counts), 0.0, int(cum[-1]) if cum else 0)


def replica_figures(before: dict, after: dict, duration: float) -> dict | None:
    """Per replica: requests, output tokens and tok/s, TTFT p50/p99 (ms), prefix hit rate,
    routed (by /routing); the policy and the imbalance. None for one engine."""
    engines = sorted(after["engines"], key=lambda e: (len(e), e))
    if len(engines) < 2:
        return None
    routing = after["routing"]
    routed0 = {str(r["engine"]): r["routed"] for r in (before["routing"] or {}).get("replicas", [])}
    state = {str(r["engine"]): r for r in (routing or {}).get("replicas", [])}
    rows = []
    for e in engines:
        a, b = after["engines"][e], before["engines"].get(e, {"ttft": {}})
        d = {k: a.get(k, 0.0) - b.get(k, 0.0) for k in WANTED}
        ttft = _ttft(b["ttft"], a["ttft"])
        row = {"engine": int(e) if e.isdigit() else e, "alive": state.get(e, {}).get("alive", True),
               "requests": int(d[SUCCESS]), "output_tokens": int(d[OUTPUT_SUM]),
               "output_throughput": d[OUTPUT_SUM] / duration if duration else 0.0,
               "ttft_p50_ms": ttft.quantile(0.5) * 1e3, "ttft_p99_ms": ttft.quantile(0.99) * 1e3,
               "prefix_hit_rate": d[HITS] / d[QUERIES] if d[QUERIES] else 0.0}
        if e in state:
            row["routed"] = state[e]["routed"] - routed0.get(e, 0)
        rows.append(row)
    counts = [row["requests"] for row in rows]
    mean = sum(counts) / len(counts)
    return {"routing_policy": routing["policy"] if routing else "server's", "replicas": rows,
            "imbalance": max(counts) / mean if mean else 0.0}
