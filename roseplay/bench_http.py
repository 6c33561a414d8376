"""`roseplay bench --base-url URL`: the bench's workloads and report against any
OpenAI-compatible server (roseplay serve, vLLM, SGLang), over streaming HTTP.

Same scenarios (roseplay/scenarios.py build_workload, same seeds), same arrival process
(burst, --submit-interval-ms, Poisson --request-rate; --max-concurrency holds arrivals
until a slot frees, as in the in-process driver) and the same report
(roseplay/bench_report.py). Timings are the client's, as vLLM's benchmark_serving
takes them: TTFT = first streamed chunk carrying output - request sent; ITL = gaps
between such chunks; TPOT = (E2E - TTFT) / (output tokens - 1); output tokens from the
server's usage (stream_options.include_usage). Token-id prompts go to /v1/completions as
token ids (exactly the in-process prompt); /v1/chat/completions gets their text.

The tokenizer comes from --model (default: the server's first model, which for
`roseplay serve` on the bundled model is "default"); dummy:* presets need none.
Warm-up requests run first, as in-process, but a remote prefix cache cannot be cleared.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import httpx
from rich.console import Console

from roseplay import bench_report as report
from roseplay.cli_flags import goodput_slos
from roseplay.driver import arrival_offsets
from roseplay.scenarios import WorkItem

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
TIMEOUT_S = 6 * 3600


@dataclass
class Outcome:
    index: int
    record: dict | None = None
    error: str | None = None
    times: list[float] = field(default_factory=list)


# -- model / tokenizer ----------------------------------------------------------------------
def served_models(base_url: str, headers: dict) -> list[str]:
    r = httpx.get(base_url.rstrip("/") + "/v1/models", headers=headers, timeout=30)
    r.raise_for_status()
    return [m["id"] for m in r.json()["data"]]


def client_tokenizer(model: str):
    """(tokenizer or None, vocab size) for building the workload on the client side."""
    if model.startswith("dummy:"):
        from engine.models.presets import preset_config
        return None, preset_config(model.removeprefix("dummy:")).vocab_size
    from transformers import AutoTokenizer
    from engine.models.loader import resolve_model_path
    tok = AutoTokenizer.from_pretrained(resolve_model_path(model))
    return tok, len(tok)


def workload(args, tokenizer, vocab_size: int) -> tuple[list[WorkItem], list[WorkItem]]:
    from roseplay.bench import workload_items     # the same items as the in-process bench
    return workload_items(args, tokenizer, vocab_size)


# -- one request --------------------------------------------------------------------------
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
            raise ValueError("chat needs text prompts: this model has no tokenizer "
                             "(use --endpoint completions)")
        body["messages"] = [{"role": "user", "content": text}]
    return body


def _has_output(choice: dict) -> bool:
    delta = choice.get("delta", choice)          # chat: delta.content; completions: text
    return bool(delta.get("content") or choice.get("text") or choice.get("token_ids"))


async def send(http: httpx.AsyncClient, path: str, body: dict, index: int,
               prompt_len: int | None) -> Outcome:
    out = Outcome(index)
    usage, finish = None, None
    start = time.perf_counter()
    try:
        async with http.stream("POST", path, json=body) as r:
            if r.status_code != 200:
                await r.aread()
                out.error = f"HTTP {r.status_code}: {r.text[:300]}"
                return out
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[6:])
                if "error" in data:
                    out.error = str(data["error"].get("message"))
                for choice in data.get("choices") or ():
                    if _has_output(choice):
                        out.times.append(time.perf_counter())
                    finish = choice.get("finish_reason") or finish
                usage = data.get("usage") or usage
    except httpx.HTTPError as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    if out.error is None:
        out.record = make_record(start, out.times, usage, prompt_len, finish)
    return out


def make_record(start: float, times: list[float], usage: dict | None,
                prompt_len: int | None, finish: str | None) -> dict:
    n_out = usage["completion_tokens"] if usage else len(times)
    n_prompt = usage["prompt_tokens"] if usage else (prompt_len or 0)
    ttft = times[0] - start if times else None
    e2e = times[-1] - start if times else None
    tpot = (e2e - ttft) / (n_out - 1) if times and n_out > 1 else None
    return {"prompt_len": n_prompt, "output_len": n_out, "ttft": ttft, "tpot": tpot,
            "e2e": e2e, "itls": [b - a for a, b in zip(times, times[1:])],
            "finish_reason": finish, "arrival_time": start,
            "last_token_time": times[-1] if times else None}


# -- a run ----------------------------------------------------------------------------------
async def drive(args, items: list[WorkItem], model: str, tokenizer, headers: dict,
                arrivals: dict, on_done=None) -> list[Outcome]:
    offsets = arrival_offsets(len(items), seed=args.seed or 0, **arrivals)
    slots = asyncio.Semaphore(args.max_concurrency or len(items))
    path = ENDPOINTS[args.endpoint]
    limits = httpx.Limits(max_connections=args.max_concurrency or len(items),
                          max_keepalive_connections=args.max_concurrency or len(items))
    async with httpx.AsyncClient(base_url=args.base_url.rstrip("/"), headers=headers,
                                 limits=limits, timeout=TIMEOUT_S) as http:
        t0 = time.perf_counter()

        async def one(i: int, item: WorkItem) -> Outcome:
            await asyncio.sleep(max(0.0, t0 + offsets[i] - time.perf_counter()))
            async with slots:
                out = await send(http, path, request_body(item, model, args.endpoint, tokenizer),
                                 i, item.prompt_len_hint)
            if on_done:
                on_done()
            return out
        return await asyncio.gather(*(one(i, it) for i, it in enumerate(items)))


def scrape_counters(base_url: str, headers: dict) -> dict[str, float]:
    """Prefix-cache and preemption counters from /metrics (roseplay serve, vLLM)."""
    from prometheus_client.parser import text_string_to_metric_families
    try:
        text = httpx.get(base_url.rstrip("/") + "/metrics", headers=headers, timeout=10).text
        fams = text_string_to_metric_families(text)
        return {s.name: s.value for f in fams for s in f.samples
                if s.name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                              "vllm:num_preemptions_total")}
    except Exception:     # a server without /metrics: the report simply omits these
        return {}


def run(args, console: Console) -> int:
    """The --base-url branch of `roseplay bench`."""
    from roseplay.bench import _arrivals, _progress
    if args.ab or args.compare:
        console.print("[red]bench: --ab and --compare need the in-process engine (drop --base-url)[/red]")
        return 2
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        model = args.model or served_models(args.base_url, headers)[0]
        tokenizer, vocab = client_tokenizer(model)
        items, warmup = workload(args, tokenizer, vocab)
        for item in items[:1]:
            request_body(item, model, args.endpoint, tokenizer)     # fail early on bad input
    except (httpx.HTTPError, OSError, ValueError) as exc:
        console.print(f"[red]bench: {type(exc).__name__}: {exc}[/red]")
        return 2
    t0 = time.perf_counter()
    with _progress(console, args) as progress:
        if warmup:
            task = progress.add_task("warm-up", total=len(warmup))
            asyncio.run(drive(args, warmup, model, tokenizer, headers, {},
                              lambda: progress.advance(task)))
        runs = []
        for i in range(args.repeat):      # measured runs on the same server, one by one
            before = scrape_counters(args.base_url, headers)
            task = progress.add_task(f"{args.endpoint} @ {args.base_url}"
                                     + (f" run {i + 1}/{args.repeat}" if args.repeat > 1 else ""),
                                     total=len(items))
            outcomes = asyncio.run(drive(args, items, model, tokenizer, headers,
                                         _arrivals(args), lambda: progress.advance(task)))
            runs.append((outcomes, before, scrape_counters(args.base_url, headers)))
    reported = [_report(console, args, *run, model) for run in runs]
    results = [result for result, _ in reported]
    if args.json:     # every run; the last one's requests and server deltas in full
        result, payload = reported[-1]
        payload["runs"] = [report.run_payload(r, report.summarize(r, goodput_slos(args)))
                           for r in results]
        report.dump_json(args.json, payload)
        console.print(f"wrote {args.json}")
    if len(results) > 1:
        report.print_repeats(console, results, report.host_cpu() + " (the client's)")
    console.print(f"[dim]total wall time {time.perf_counter() - t0:.1f} s[/dim]")
    return 0 if all(r.failed == 0 for r in results) else 1


def _report(console: Console, args, outcomes, before, after, model
            ) -> tuple[report.RunResult, dict]:
    """Print one run's report; return it and its JSON payload."""
    records = [o.record for o in outcomes if o.record is not None]
    failed = [o for o in outcomes if o.error is not None]
    for o in failed[:3]:
        console.print(f"request {o.index} failed: {o.error}", highlight=False)
    result = report.RunResult(f"{args.endpoint} @ {args.base_url} ({model})",
                              report.wall_duration(records), records, failed=len(failed))
    summary = report.summarize(result, goodput_slos(args))
    report.print_summary(console, result, summary)
    server = {k: after[k] - before.get(k, 0.0) for k in after}
    q = server.get("vllm:prefix_cache_queries_total")
    if q:
        console.print(f"server prefix cache hit rate (tokens): "
                      f"{100 * server['vllm:prefix_cache_hits_total'] / q:.1f} %; preemptions: "
                      f"{server.get('vllm:num_preemptions_total', 0):.0f}", highlight=False)
    payload = {"bench": {k: v for k, v in vars(args).items() if k not in ("func", "api_key")},
               "mode": "http", "summary": summary, "requests": records,
               "server_metrics_delta": server}
    return result, payload
