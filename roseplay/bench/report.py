"""Bench results: per-request records, vLLM-style summaries, Rich tables, JSON.

A `RunResult` is one measured run (our engine, or an HF baseline): per-request records
(prompt/output lengths, TTFT, TPOT, ITLs, E2E, all in seconds) plus the wall duration
and, for our engine, engine stats. `summarize` turns it into the numbers that vLLM's
benchmark_serving prints; latencies in the summary are in milliseconds.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table

from engine.metrics import Summary, goodput, percentile, prefix_hit_rate
from roseplay.bench.vllm_result import (DEFAULT_METRICS, DEFAULT_PERCENTILES, METRICS,
                                        latencies, p_word)

LATENCIES = (("ttft", "TTFT", "Time to First Token"), ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
             ("itl", "ITL", "Inter-token Latency"), ("e2e", "E2EL", "End-to-end Latency"))


@dataclass
class RunResult:
    label: str
    duration: float                       # s, first arrival -> last token
    requests: list[dict]                  # see request_record
    engine: dict = field(default_factory=dict)
    knobs: dict = field(default_factory=dict)
    failed: int = 0
    steps: list[dict] = field(default_factory=list)   # see step_records


def engine_stats(snap0, snap1) -> dict:
    """The engine's counters over a run (two snapshots), with its prefix hit rate, peak
    KV usage and vLLM's kv_block_* residency metrics (count, mean, p50/p90/p99 in s)."""
    d = dataclasses.asdict(snap1.counters.minus(snap0.counters))
    d["prefix_hit_rate"] = prefix_hit_rate(d["prefix_hit_tokens"], d["prefix_queried_tokens"]) or 0.0
    d["peak_used_blocks"] = snap1.peak_used_blocks
    d["num_blocks"] = snap1.num_blocks
    d["peak_kv_usage"] = d["peak_used_blocks"] / d["num_blocks"]
    d["kv_block"] = snap1.kv_block_metrics.minus(snap0.kv_block_metrics).summary()
    d.update(host_tier_stats(d, snap1))
    return d


def host_tier_stats(d: dict, snap) -> dict:
    """The host tier's share of a run (from the counter deltas `d`): hit rate by tier
    (device + host = prefix_hit_rate), bytes copied each way and the copies' bandwidth
    (bytes / the copy streams' time; 0 without copies)."""
    size = snap.kv_bytes_per_block
    host = prefix_hit_rate(d["host_prefix_hit_tokens"], d["prefix_queried_tokens"]) or 0.0
    out = {"host_num_blocks": snap.host_num_blocks, "host_hit_rate": host,
           "device_hit_rate": d["prefix_hit_rate"] - host}
    for way, blocks, us in (("offload", "kv_offload_blocks", "kv_offload_us"),
                            ("reload", "kv_reload_blocks", "kv_reload_us")):
        nbytes = d[blocks] * size
        out[f"kv_{way}_bytes"] = nbytes
        out[f"kv_{way}_gbps"] = nbytes / d[us] / 1e3 if d[us] > 0 else 0.0
    return out


def spec_decode_stats(e: dict, pos0: tuple, pos1: tuple) -> dict | None:
    """Speculative decoding over a run (None: no drafts): acceptance rate, mean acceptance
    length (accepted drafts + the target's own token, per verification; vLLM's bench) and
    the acceptance rate of each draft position (per_pos: the engine's cumulative counts at
    the start and the end)."""
    drafts, tokens = e["spec_decode_num_drafts"], e["spec_decode_num_draft_tokens"]
    if not drafts:
        return None
    accepted = e["spec_decode_num_accepted_tokens"]
    per_pos = [n - (pos0[i] if i < len(pos0) else 0) for i, n in enumerate(pos1)]
    return {"num_drafts": drafts, "num_draft_tokens": tokens, "num_accepted_tokens": accepted,
            "acceptance_rate": accepted / tokens if tokens else 0.0,
            "mean_acceptance_length": 1 + accepted / drafts,
            "accepted_per_pos": per_pos,
            "acceptance_rate_per_pos": [n / drafts for n in per_pos]}


def step_records(snap0, snap1) -> list[dict]:
    """The engine's steps between two snapshots (at most its last 256, the snapshot's
    ring): when each ended (t, s after the first), the gap since the one before (dt),
    its own duration and its tokens. `--json` keeps them per run, so a slow run can be
    compared with a fast one step by step."""
    steps = [s for s in snap1.recent_steps if s.step > snap0.counters.steps]
    if not steps:
        return []
    first, prev = steps[0].wall_time, steps[0].wall_time
    out = []
    for s in steps:
        out.append({"step": s.step, "t": s.wall_time - first, "dt": s.wall_time - prev,
                    "duration": s.duration, "decode_tokens": s.decode_tokens,
                    "prefill_tokens": s.prefill_tokens, "running": s.num_running})
        prev = s.wall_time
    return out


def request_record(output) -> dict:
    """Per-request numbers of one engine RequestOutput (seconds)."""
    m = output.metrics
    comp = output.outputs[0]
    return {"request_id": output.request_id, "prompt_len": len(output.prompt_token_ids),
            "output_len": len(comp.token_ids), "ttft": m.ttft, "tpot": m.tpot, "e2e": m.e2e,
            "itls": list(m.itls), "cached_tokens": m.num_cached_tokens,
            "host_cached_tokens": m.num_host_cached_tokens,
            "preemptions": m.num_preemptions, "finish_reason": comp.finish_reason,
            "arrival_time": m.arrival_time, "last_token_time": m.last_token_time}


def times_record(prompt_len: int, arrival: float, times: list[float], **extra) -> dict:
    """A request record from raw token timestamps (HF baselines)."""
    itls = [b - a for a, b in zip(times, times[1:])]
    rec = {"prompt_len": prompt_len, "output_len": len(times),
           "ttft": times[0] - arrival if times else None,
           "tpot": (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None,
           "e2e": times[-1] - arrival if times else None, "itls": itls,
           "arrival_time": arrival, "last_token_time": times[-1] if times else None}
    rec.update(extra)
    return rec


def wall_duration(records: list[dict]) -> float:
    """First arrival to last token over the records (0 if none produced a token)."""
    ends = [r["last_token_time"] for r in records if r.get("last_token_time") is not None]
    if not ends:
        return 0.0
    return max(ends) - min(r["arrival_time"] for r in records)


def _ms(s: Summary) -> dict:
    """A latency summary in ms; with no value (TPOT and ITL when every output has one
    token: no gap between tokens) every figure is 0 and count 0, as vLLM's bench prints
    (`np.mean(tpots or 0)`), not NaN."""
    scale = 1000.0
    if not s.count:
        return {"mean": 0.0, "median": 0.0, "p95": 0.0, "p99": 0.0, "max": 0.0, "count": 0}
    return {"mean": s.mean * scale, "median": s.p50 * scale, "p95": s.p95 * scale,
            "p99": s.p99 * scale, "max": s.max * scale, "count": s.count}


def summarize(result: RunResult, slos: dict[str, float] | None = None,
              metrics: tuple[str, ...] = DEFAULT_METRICS,
              percentiles: tuple[float, ...] = DEFAULT_PERCENTILES) -> dict:
    """The vLLM benchmark_serving numbers (latencies in ms) plus engine stats; with SLOs
    (ms, `--goodput ttft:200 ...`), the request goodput too. Each latency holds mean,
    median, p95, p99, max and `percentiles` (--metric-percentiles: p25, p99.9, ...);
    `metrics` (--percentile-metrics, vLLM's names) are the ones the block prints."""
    reqs = result.requests
    n_in = sum(r["prompt_len"] for r in reqs)
    n_out = sum(r["output_len"] for r in reqs)
    dur = result.duration
    # no duration: no request produced a token (each failed), so every rate is 0, as
    # vLLM's bench prints for such a run (NaN read as a broken figure)
    rate = (lambda x: x / dur) if dur > 0 else (lambda x: 0.0)
    out = {"successful_requests": len(reqs), "failed_requests": result.failed,
           "duration_s": dur, "total_input_tokens": n_in, "total_output_tokens": n_out,
           "request_throughput": rate(len(reqs)), "output_throughput": rate(n_out),
           "total_token_throughput": rate(n_in + n_out)}
    out["ttft_ms"] = _ms(Summary.of(r["ttft"] for r in reqs))
    out["tpot_ms"] = _ms(Summary.of(r["tpot"] for r in reqs))
    out["itl_ms"] = _ms(Summary.of(x for r in reqs for x in r["itls"]))
    out["e2e_ms"] = _ms(Summary.of(r["e2e"] for r in reqs))
    for name, key in METRICS.items():
        stats = out[f"{key}_ms"]
        for p in percentiles:
            if f"p{p_word(p)}" not in stats:
                values = latencies(reqs, name)
                stats[f"p{p_word(p)}"] = 1000 * percentile(values, p) if values else 0.0
    out["percentile_metrics"], out["metric_percentiles"] = list(metrics), list(percentiles)
    if slos:
        good, _ = goodput(((r["ttft"], r["tpot"], r["e2e"]) for r in reqs), slos, dur)
        out.update(goodput_slos_ms=dict(slos), good_requests=good, request_goodput=rate(good))
    if result.engine:
        out["engine"] = dict(result.engine)
    return out


def print_summary(console: Console, result: RunResult, summary: dict | None = None) -> None:
    """The vLLM-style result block."""
    s = summary or summarize(result)
    w = 50
    console.print("{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=w, c="="))
    if result.label:
        console.print("{:<40} {:>10}".format("Run:", result.label))
    rows = [("Successful requests:", s["successful_requests"], "d"),
            ("Failed requests:", s["failed_requests"], "d"),
            ("Benchmark duration (s):", s["duration_s"], ".2f"),
            ("Total input tokens:", s["total_input_tokens"], "d"),
            ("Total generated tokens:", s["total_output_tokens"], "d"),
            ("Request throughput (req/s):", s["request_throughput"], ".2f"),
            *([("Request goodput (req/s):", s["request_goodput"], ".2f")]
              if "request_goodput" in s else []),
            ("Output token throughput (tok/s):", s["output_throughput"], ".2f"),
            ("Total token throughput (tok/s):", s["total_token_throughput"], ".2f")]
    for label, value, fmt in rows:
        console.print(f"{label:<40} {value:>10{fmt}}", highlight=False)
    shown = {METRICS[m] for m in s.get("percentile_metrics", DEFAULT_METRICS)}
    columns = [("mean", "Mean"), ("median", "Median")] + [
        (f"p{p_word(p)}", f"P{p_word(p)}") for p in s.get("metric_percentiles",
                                                          DEFAULT_PERCENTILES)]
    for key, short, long in LATENCIES:
        if key not in shown:
            continue
        console.print("{s:{c}^{n}}".format(s=f" {long} ", n=w, c="-"))
        for stat, name in columns:
            console.print(f"{f'{name} {short} (ms):':<40} {s[key + '_ms'][stat]:>10.2f}",
                          highlight=False)
    if "engine" in s:
        _print_engine(console, s["engine"], w)
    console.print("=" * w)


def _print_engine(console: Console, e: dict, w: int) -> None:
    console.print("{s:{c}^{n}}".format(s=" Engine ", n=w, c="-"))
    rows = [("Prefix cache hit rate (tokens):", f"{100 * e['prefix_hit_rate']:.1f} %"),
            ("Preemptions:", e["preemptions"]), ("Evictions:", e["evictions"]),
            ("COW copies:", e["cow_copies"]), ("Dedup joined:", e["dedup_joined"]),
            ("Engine steps:", e["steps"]),
            ("Host share of engine time (%):", f"{100 * e.get('host_share', 0):.1f}"),
            ("Peak KV usage (blocks):", f"{e['peak_used_blocks']}/{e['num_blocks']} "
                                        f"({100 * e['peak_kv_usage']:.1f} %)")]
    for label, value in rows + _block_rows(e.get("kv_block")) + _host_rows(e):
        console.print(f"{label:<40} {value!s:>10}", highlight=False)
    if e.get("data_parallel"):
        from roseplay.bench.replicas import print_replicas
        print_replicas(console, e["data_parallel"], w)
    spec = e.get("spec_decode")
    if spec:
        console.print("{s:{c}^{n}}".format(s=" Speculative decoding ", n=w, c="-"))
        per_pos = " ".join(f"{r:.2f}" for r in spec["acceptance_rate_per_pos"])
        for label, value in (("Drafts:", spec["num_drafts"]),
                             ("Draft tokens:", spec["num_draft_tokens"]),
                             ("Accepted tokens:", spec["num_accepted_tokens"]),
                             ("Acceptance rate (%):", f"{100 * spec['acceptance_rate']:.1f}"),
                             ("Mean acceptance length:",
                              f"{spec['mean_acceptance_length']:.2f}"),
                             ("Per-position acceptance rate:", per_pos)):
            console.print(f"{label:<40} {value!s:>10}", highlight=False)


def _host_rows(e: dict) -> list[tuple[str, str]]:
    """The host tier (kv_offloading_size): hits by tier, copies each way, swaps."""
    if not e.get("host_num_blocks"):
        return []
    gb = lambda way: f"{e[f'kv_{way}_bytes'] / 1e9:.3f} GB, {e[f'kv_{way}_gbps']:.1f} GB/s"
    return [("Hit rate device / host (%):", f"{100 * e['device_hit_rate']:.1f} / "
                                             f"{100 * e['host_hit_rate']:.1f}"),
            ("Copied to the host tier:", gb("offload")),
            ("Copied back from the host tier:", gb("reload")),
            ("Swaps out / in / fallbacks:", f"{e['swap_outs']} / {e['swap_ins']} / "
                                            f"{e['swap_fallbacks']}")]


def _block_rows(blocks: dict | None) -> list[tuple[str, str]]:
    """KV-block residency (vLLM's kv_block_* histograms): median and p99, in seconds."""
    if not blocks:
        return []
    names = (("lifetime", "KV block lifetime"), ("idle_before_evict", "KV block idle before evict"),
             ("reuse_gap", "KV block reuse gap"))
    return [(f"{label} p50/p99 (s):", f"{_fmt(blocks[k]['p50_s'])}/{_fmt(blocks[k]['p99_s'])}")
            for k, label in names if blocks[k]["count"]]


# -- tables ------------------------------------------------------------------------------
METRIC_ROWS = (  # (label, getter, higher is better)
    ("Request throughput (req/s)", lambda s: s["request_throughput"], True),
    ("Output throughput (tok/s)", lambda s: s["output_throughput"], True),
    ("Duration (s)", lambda s: s["duration_s"], False),
    ("TTFT mean (ms)", lambda s: s["ttft_ms"]["mean"], False),
    ("TTFT p50 (ms)", lambda s: s["ttft_ms"]["median"], False),
    ("TTFT p99 (ms)", lambda s: s["ttft_ms"]["p99"], False),
    ("TPOT mean (ms)", lambda s: s["tpot_ms"]["mean"], False),
    ("ITL p50 (ms)", lambda s: s["itl_ms"]["median"], False),
    ("ITL p99 (ms)", lambda s: s["itl_ms"]["p99"], False),
    ("E2E p50 (ms)", lambda s: s["e2e_ms"]["median"], False),
)
ENGINE_ROWS = (
    ("Prefix hit rate (%)", lambda s: 100 * s["engine"]["prefix_hit_rate"]),
    ("  of it from the host tier (%)", lambda s: 100 * s["engine"]["host_hit_rate"]),
    ("Preemptions", lambda s: s["engine"]["preemptions"]),
    ("Evictions", lambda s: s["engine"]["evictions"]),
    ("COW copies", lambda s: s["engine"]["cow_copies"]),
    ("Peak KV blocks", lambda s: s["engine"]["peak_used_blocks"]),
    ("KV block lifetime p50 (s)", lambda s: s["engine"]["kv_block"]["lifetime"]["p50_s"]),
    ("KV idle-before-evict p50 (s)",
     lambda s: s["engine"]["kv_block"]["idle_before_evict"]["p50_s"]),
    ("KV block reuse gap p50 (s)", lambda s: s["engine"]["kv_block"]["reuse_gap"]["p50_s"]),
)


def ratio(value: float, base: float) -> float:
    if base == 0 or math.isnan(base) or math.isnan(value):
        return math.nan if value != base else 1.0
    return value / base


def _fmt(x) -> str:
    if isinstance(x, int):
        return str(x)
    if x is None or math.isnan(x):
        return "-"
    return f"{x:,.2f}" if abs(x) < 1e5 else f"{x:,.0f}"


def side_by_side(title: str, labels: list[str], summaries: list[dict]) -> Table:
    """One column per run, each cell `value (x ratio vs the first run)`."""
    table = Table(title=title, title_justify="left")
    table.add_column("metric")
    for label in labels:
        table.add_column(label, justify="right")
    good = [("Request goodput (req/s)", lambda s: s["request_goodput"], True)] if all(
        "request_goodput" in s for s in summaries) else []
    rows = list(METRIC_ROWS[:1]) + good + list(METRIC_ROWS[1:]) + [(n, g, None) for n, g in ENGINE_ROWS
                                if all("engine" in s for s in summaries)]
    for name, get, _ in rows:
        values = [get(s) for s in summaries]
        cells = [_fmt(values[0])]
        for v in values[1:]:
            cells.append(f"{_fmt(v)} (x{_fmt(ratio(v, values[0]))})")
        table.add_row(name, *cells)
    return table


def dump_json(path: str, payload: dict) -> None:
    def clean(x):
        if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x
    with open(path, "w") as f:
        json.dump(clean(payload), f, indent=1)
        f.write("\n")


def run_payload(result: RunResult, summary: dict | None = None) -> dict:
    return {"label": result.label, "knobs": result.knobs,
            "summary": summary or summarize(result), "requests": result.requests,
            "steps": result.steps}


def print_repeats(console: Console, results: list[RunResult], cpu: str) -> None:
    """Every run's output throughput and TTFT p50, then median and min..max: one lucky
    run is not a result."""
    import statistics
    sums = [summarize(r) for r in results]
    tput = [s["output_throughput"] for s in sums]
    ttft = [s["ttft_ms"]["median"] for s in sums]
    tpot = [s["tpot_ms"]["median"] for s in sums if s["tpot_ms"]["count"]]
    host = [100 * s["engine"].get("host_share", 0) for s in sums if "engine" in s]
    med = statistics.median(tput)
    console.print(f"runs (output tok/s): {' / '.join(f'{x:,.0f}' for x in tput)}", highlight=False)
    console.print(f"output throughput: median {med:,.0f} tok/s, min..max {min(tput):,.0f}.."
                  f"{max(tput):,.0f} (spread {100 * (max(tput) - min(tput)) / med:.1f}% of the "
                  f"median) over {len(tput)} runs; TTFT p50 median {statistics.median(ttft):.1f} ms "
                  f"({min(ttft):.1f}..{max(ttft):.1f}); host CPU: {cpu}", highlight=False)
    if tpot:     # to the microsecond: the batch-1 target (0.70 ms) is one digit further
        console.print(f"TPOT p50: median {statistics.median(tpot):.3f} ms ({min(tpot):.3f}.."
                      f"{max(tpot):.3f})", highlight=False)
    if host:
        console.print(f"host share of engine time (not waiting on the device): median "
                      f"{statistics.median(host):.1f}% ({min(host):.1f}..{max(host):.1f})",
                      highlight=False)


def print_interrupted(console: Console, results: list[RunResult], elapsed: float,
                      json_path: str | None, payload: dict, options: dict | None = None,
                      vllm_fields=None) -> None:
    """After Ctrl-C: every finished run and the finished part of the interrupted one
    (summarized with `options`, summarize's keywords, as a finished run's report);
    `payload`: the JSON's fields besides the runs, `vllm_fields(records, summary)`:
    vLLM's of the last run."""
    console.print(f"[yellow]interrupted after {elapsed:.1f} s[/yellow]")
    if not results:
        console.print("nothing was measured yet")
        return
    summaries = [summarize(r, **(options or {})) for r in results]
    for result, summary in zip(results, summaries):
        print_summary(console, result, summary)
    if json_path:
        payload = dict(payload, mode="interrupted", summary=summaries[-1],
                       runs=[run_payload(r, s) for r, s in zip(results, summaries)])
        if vllm_fields:
            payload.update(vllm_fields(results[-1].requests, summaries[-1]))
        dump_json(json_path, payload)
        console.print(f"wrote {json_path}")

