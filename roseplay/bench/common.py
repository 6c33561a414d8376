"""What both benches share (the in-process one, roseplay/bench/inproc.py, and the HTTP one,
roseplay/bench/http.py): the workload of the bench flags, the arrival process, the
summary's options, the progress bar and the host CPU's name. Its own module so that neither bench imports the other's privates."""
from __future__ import annotations

import math

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from roseplay.cli_flags import goodput_slos
from roseplay.workload.items import WorkItem
from roseplay.workload.scenarios import build_workload


def workload_items(args, tokenizer, vocab_size: int) -> tuple[list[WorkItem], list[WorkItem]]:
    """The measured items and the warm-up items of the bench flags (in-process or HTTP)."""
    kw = dict(tokenizer=tokenizer, vocab_size=vocab_size, input_len=args.input_len,
              output_len=args.output_len, range_ratio=args.range_ratio,
              temperature=args.temperature)
    seed = args.seed or 0
    items = build_workload(args.scenario, args.num_prompts, seed=seed, **kw)
    warmup = build_workload(args.scenario, args.warmup, seed=seed + 1, **kw) if args.warmup else []
    return items, warmup


def arrivals(args) -> dict:
    """The arrival process of the flags, as WorkloadDriver / arrival_offsets take it
    (the burstiness shapes the gaps of a request rate only)."""
    rate = args.request_rate
    if rate is not None and math.isinf(rate):
        rate = None
    interval = args.submit_interval_ms / 1000.0 if args.submit_interval_ms is not None else None
    return {"request_rate": rate, "submit_interval": interval, "burstiness": args.burstiness}


def traffic_lines(args) -> str:
    """The arrival process, as vLLM's bench prints it before a run (rate, burstiness,
    concurrency cap), or the fixed interval of --submit-interval-ms."""
    if args.submit_interval_ms is not None:
        lines = [f"Traffic: one request every {args.submit_interval_ms:g} ms"]
    elif args.request_rate is None:
        lines = ["Traffic request rate: inf"]
    else:
        shape = "Poisson process" if args.burstiness == 1.0 else "Gamma distribution"
        lines = [f"Traffic request rate: {args.request_rate:g}",
                 f"Burstiness factor: {args.burstiness:g} ({shape})"]
    return "\n".join(lines + [f"Maximum request concurrency: {args.max_concurrency}"])


def summary_options(args) -> dict:
    """report.summarize's keywords of the flags: --goodput's SLOs, --percentile-metrics,
    --metric-percentiles."""
    return {"slos": goodput_slos(args), "metrics": args.percentile_metrics,
            "percentiles": args.metric_percentiles}


def progress(console: Console, args) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console, transient=True,
                    disable=args.no_progress)


def host_cpu() -> str:
    """The host CPU's model name (numbers depend on it: the host prepares every step)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or "unknown"
