"""`roseplay bench --base-url URL`: the bench's workloads and report against any
OpenAI-compatible server (roseplay serve, vLLM, SGLang), over streaming HTTP.

Same scenarios (roseplay/workload/scenarios.py build_workload, same seeds), same arrival process
(burst, --submit-interval-ms, Poisson --request-rate; --max-concurrency holds arrivals
until a slot frees, as in the in-process driver) and the same report
(roseplay/bench/report.py). Timings are the client's, as vLLM's benchmark_serving
takes them: TTFT = first streamed chunk carrying output - request sent; ITL = gaps
between such chunks; TPOT = (E2E - TTFT) / (output tokens - 1); output tokens from the
server's usage (stream_options.include_usage). Token-id prompts go to /v1/completions as
token ids (exactly the in-process prompt); /v1/chat/completions gets their text.

The tokenizer comes from --model (default: the server's first model, which for
`roseplay serve` on the bundled model is "default"); dummy:* presets need none.
Warm-up requests run first, as in-process; before each measured run the server's prefix
cache is cleared (POST /reset_prefix_cache, vLLM's dev endpoint, which `roseplay serve`
has; a server without it answers 404 and keeps its cache), as the direct bench clears it.
"""
from __future__ import annotations

import contextlib
import sys
import time

import httpx
from rich.console import Console

from roseplay.bench import report, vllm_result
from roseplay.bench.args import ENDPOINT_PATHS, recorded_args
from roseplay.bench.clients import ClientLoad, ClientPool, Job, LoadInterrupted, run_load
from roseplay.bench.common import (arrivals, host_cpu, progress, summary_options,
                                   traffic_lines, workload_items)
from roseplay.bench.sse import Outcome
from roseplay.cli_checks import server_refuses_every_request
from roseplay.cli_flags import usage_error
from roseplay.bench import http_replicas as replicas
from roseplay.workload.driver import arrival_offsets
from roseplay.workload.items import WorkItem



# -- model / tokenizer ----------------------------------------------------------------------
def served_models(base_url: str, headers: dict) -> dict[str, int | None]:
    """The server's models: id -> its max_model_len (vLLM's model card field; None where
    the server does not say)."""
    r = httpx.get(base_url.rstrip("/") + "/v1/models", headers=headers, timeout=30)
    r.raise_for_status()
    return {m["id"]: m.get("max_model_len") for m in r.json()["data"]}


def client_tokenizer(model: str):
    """(tokenizer or None, vocab size) for building the workload on the client side."""
    if model.startswith("dummy:"):
        from engine.worker.models.presets import preset_config
        return None, preset_config(model.removeprefix("dummy:")).vocab_size
    from transformers import AutoTokenizer
    from engine.worker.models.loader import resolve_model_path
    tok = AutoTokenizer.from_pretrained(resolve_model_path(model))
    return tok, len(tok)


# -- one request body ---------------------------------------------------------------------
def request_body(item: WorkItem, model: str, endpoint: str, tokenizer) -> dict:
    p = item.params
    body = {"model": model, "max_tokens": p.max_tokens, "temperature": p.temperature,
            "stream": True, "stream_options": {"include_usage": True},
            "return_token_ids": True}     # vLLM's extra: chunks of text-less tokens count too
    if p.ignore_eos:
        body["ignore_eos"] = True          # vLLM's extra (roseplay serve, vLLM, SGLang)
    if p.seed is not None:
        body["seed"] = p.seed
    prompt = item.prompt
    if endpoint == "completions":
        body["prompt"] = prompt if isinstance(prompt, str) else list(prompt["prompt_token_ids"])
    else:
        text = prompt if isinstance(prompt, str) else (
            prompt.get("prompt") or (tokenizer.decode(prompt["prompt_token_ids"]) if tokenizer
                                     else None))
        if text is None:
            raise ValueError(f"--endpoint chat needs text prompts: {model} has no tokenizer "
                             "(use --endpoint completions)")
        body["messages"] = [{"role": "user", "content": text}]
    return body


# -- a run ----------------------------------------------------------------------------------
def load_job(args, items: list[WorkItem], model: str, tokenizer, headers: dict,
             arrival: dict) -> Job:
    offsets = arrival_offsets(len(items), seed=args.seed or 0, **arrival)
    requests = [(i, request_body(it, model, args.endpoint, tokenizer), it.prompt_len_hint)
                for i, it in enumerate(items)]
    return Job(args.base_url, ENDPOINT_PATHS[args.endpoint], headers, requests, offsets,
               args.max_concurrency or len(items))


SERVER_COUNTERS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                   "vllm:num_preemptions_total")
# vLLM's KV offloading counters, one sample per transfer_type (kept as NAME/TYPE)
OFFLOAD_COUNTERS = ("vllm:kv_offload_total_bytes_total", "vllm:kv_offload_total_time_total")
SERVER_HISTOGRAMS = {"ttft": "vllm:time_to_first_token_seconds",
                     "tpot": "vllm:request_time_per_output_token_seconds",
                     "itl": "vllm:inter_token_latency_seconds",
                     "e2e": "vllm:e2e_request_latency_seconds"}


def reset_prefix_cache(base_url: str, headers: dict) -> bool:
    """Clear the server's prefix cache so that a run does not hit the previous run's
    prompts; False when the server has no such endpoint (404/405) or it failed."""
    try:
        r = httpx.post(base_url.rstrip("/") + "/reset_prefix_cache", headers=headers, timeout=10)
    except httpx.HTTPError:
        return False
    return r.status_code == 200


def scrape_counters(base_url: str, headers: dict) -> dict[str, float]:
    """Prefix-cache and preemption counters and the latency histograms' sums and counts
    from /metrics (roseplay serve, vLLM)."""
    from prometheus_client.parser import text_string_to_metric_families
    wanted = set(SERVER_COUNTERS) | {h + x for h in SERVER_HISTOGRAMS.values()
                                     for x in ("_sum", "_count")} | set(OFFLOAD_COUNTERS)
    try:
        text = httpx.get(base_url.rstrip("/") + "/metrics", headers=headers, timeout=10).text
        fams = text_string_to_metric_families(text)
        return {s.name + (f"/{s.labels['transfer_type']}" if "transfer_type" in s.labels
                          else ""): s.value
                for f in fams for s in f.samples if s.name in wanted}
    except Exception:     # a server without /metrics: the report simply omits these
        return {}


def offload_line(delta: dict[str, float]) -> str | None:
    """The server's KV offloading over a run (vLLM's counters): bytes and bandwidth each
    way; None when it has no host tier."""
    parts = []
    for kind in ("GPU_to_CPU", "CPU_to_GPU"):
        nbytes = delta.get(f"{OFFLOAD_COUNTERS[0]}/{kind}")
        if nbytes is None:
            return None
        secs = delta.get(f"{OFFLOAD_COUNTERS[1]}/{kind}", 0.0)
        parts.append(f"{kind} {nbytes / 1e9:.3f} GB" +
                     (f" at {nbytes / secs / 1e9:.1f} GB/s" if secs > 0 else ""))
    return "server KV offload: " + ", ".join(parts)


def server_means(delta: dict[str, float]) -> dict[str, float]:
    """The server's own mean latencies over a run (ms), from its histogram deltas."""
    out = {}
    for key, name in SERVER_HISTOGRAMS.items():
        n = delta.get(name + "_count")
        if n:
            out[key] = 1000 * delta[name + "_sum"] / n
    return out


def run(args, console: Console) -> int:
    """The --base-url branch of `roseplay bench`."""
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        served = served_models(args.base_url, headers)   # reachable, key accepted: else
        model = args.model or next(iter(served))        # one line, not N failed requests
        if model not in served:                          # (each request's 404)
            raise ValueError(f"--model {model}: not served at {args.base_url} (it serves: "
                             f"{', '.join(served)})")
        if problem := server_refuses_every_request(args, served[model]):
            raise ValueError(problem)
        tokenizer, vocab = client_tokenizer(model)
        items, warmup = workload_items(args, tokenizer, vocab)
        job = load_job(args, items, model, tokenizer, headers, arrivals(args))
        warm_job = load_job(args, warmup, model, tokenizer, headers, {}) if warmup else None
    except (httpx.HTTPError, OSError) as exc:   # one line on stderr
        first = (str(exc).splitlines() or [""])[0]     # httpx adds a line of MDN link
        print(f"roseplay bench: error: {args.base_url}: {type(exc).__name__}: {first}",
              file=sys.stderr)
        return 2
    except ValueError as exc:     # a flag the server or the model cannot take
        print(usage_error("roseplay bench", str(exc)), file=sys.stderr)
        return 2
    console.print(traffic_lines(args), highlight=False)
    t0 = time.perf_counter()
    runs, measuring = [], [False]
    try:
        _load_runs(args, console, job, warm_job, headers, runs, measuring)
    except (KeyboardInterrupt, LoadInterrupted) as exc:   # Ctrl-C: what finished, exit 130
        partial = getattr(exc, "outcomes", None) if measuring[0] else None
        results = [_result(args, r[0], model) for r in runs]
        if partial:
            results.append(_result(args, partial, model, " (interrupted)"))
        report.print_interrupted(
            console, results, time.perf_counter() - t0, vllm_result.result_path(args, model),
            {"bench": recorded_args(args)}, summary_options(args),
            lambda reqs, summary: vllm_result.fields(args, reqs, summary, model))
        return 130
    reported = [_report(console, args, *run, model) for run in runs]
    results = [result for result, _ in reported]
    path = vllm_result.result_path(args, model)
    if path:     # every run; the last one's requests and server deltas in full
        result, payload = reported[-1]
        payload["runs"] = [dict(report.run_payload(r, p["summary"]), client=p["client"])
                           for r, p in reported]
        payload.update(vllm_result.fields(args, result.requests, payload["summary"], model))
        report.dump_json(path, payload)
        console.print(f"wrote {path}")
    if len(results) > 1:
        report.print_repeats(console, results, host_cpu() + " (the client's)")
        console.print(client_line([run[1] for run in runs]), highlight=False)
    console.print(f"[dim]total wall time {time.perf_counter() - t0:.1f} s[/dim]")
    return 0 if all(r.failed == 0 for r in results) else 1


def _load_runs(args, console: Console, job: Job, warm_job: Job | None, headers: dict,
               runs: list, measuring: list) -> None:
    """The warm-up, then each measured run with the server's counters around it, into
    `runs`; measuring[0] is True once the warm-up is over."""
    pool = ClientPool(args.num_clients) if args.num_clients > 1 else None
    with progress(console, args) as bar, (pool or contextlib.nullcontext()):
        def load(j: Job, label: str):
            task = bar.add_task(label, total=len(j.requests))
            return run_load(j, pool, lambda n: bar.update(task, completed=n))
        if warm_job:
            load(warm_job, "warm-up")
        measuring[0] = True
        for i in range(args.repeat):      # measured runs on the same server, one by one
            reset_prefix_cache(args.base_url, headers)
            before = scrape_counters(args.base_url, headers), replicas.scrape(args.base_url,
                                                                              headers)
            outcomes, client = load(job, f"{args.endpoint} @ {args.base_url}" + (
                f" run {i + 1}/{args.repeat}" if args.repeat > 1 else ""))
            runs.append((outcomes, client, before, (scrape_counters(args.base_url, headers),
                                                    replicas.scrape(args.base_url, headers))))


def _result(args, outcomes: list[Outcome], model: str, suffix: str = "") -> report.RunResult:
    """One run's RunResult from its outcomes (failed ones counted, not measured)."""
    records = [o.record for o in outcomes if o.record is not None]
    failed = sum(o.error is not None for o in outcomes)
    return report.RunResult(f"{args.endpoint} @ {args.base_url} ({model}){suffix}",
                            report.wall_duration(records), records, failed=failed)


def client_line(loads: list[ClientLoad]) -> str:
    """The client's CPU next to the figures it measured: a busiest process near 100 %
    of a core means the client, not the server, may be the limit."""
    d = [c.as_dict() for c in loads]
    return (f"client CPU ({loads[0].processes} process{'es' if loads[0].processes > 1 else ''}): "
            + " / ".join(f"{x['cores']:.2f}" for x in d) + " cores; busiest process "
            + " / ".join(f"{100 * x['max_process_util']:.0f}" for x in d) + " % of a core; "
            + "SSE chunks/s " + " / ".join(f"{x['chunks_per_s']:,.0f}" for x in d))


def _report(console: Console, args, outcomes: list[Outcome], client: ClientLoad, before, after,
            model) -> tuple[report.RunResult, dict]:
    """Print one run's report; return it and its JSON payload. before/after: the server's
    counters and its per-replica figures (roseplay/bench/http_replicas.py)."""
    (before, replicas0), (after, replicas1) = before, after
    for o in [o for o in outcomes if o.error is not None][:3]:
        console.print(f"request {o.index} failed: {o.error}", highlight=False)
    result = _result(args, outcomes, model)
    summary = report.summarize(result, **summary_options(args))
    report.print_summary(console, result, summary)
    console.print(client_line([client]), highlight=False)
    server = {k: after[k] - before.get(k, 0.0) for k in after}
    own = server_means(server)
    if own:      # the server's view: arrival in its front -> the engine's token times
        console.print("server's own means (ms; the client's in brackets): " + ", ".join(
            f"{k.upper()} {v:.2f} ({summary[k + '_ms']['mean']:.2f})" for k, v in own.items()),
            highlight=False)
    q = server.get("vllm:prefix_cache_queries_total")
    if q:
        console.print(f"server prefix cache hit rate (tokens): "
                      f"{100 * server['vllm:prefix_cache_hits_total'] / q:.1f} %; preemptions: "
                      f"{server.get('vllm:num_preemptions_total', 0):.0f}", highlight=False)
    if (line := offload_line(server)) is not None:
        console.print(line, highlight=False)
    per_replica = replicas.replica_figures(replicas0, replicas1, result.duration)
    if per_replica:          # a data-parallel server: each replica's share
        from roseplay.bench.replicas import print_replicas
        print_replicas(console, per_replica, 50)     # print_summary's width
    payload = {"bench": recorded_args(args),
               "mode": "http", "summary": summary, "requests": result.requests,
               "server_metrics_delta": server, "server_means_ms": own,
               "client": client.as_dict(), "data_parallel": per_replica}
    return result, payload
