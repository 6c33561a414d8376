"""vLLM `bench serve`'s result options: --save-result (a file in --result-dir, named as
vLLM names it, or --result-filename), --percentile-metrics and --metric-percentiles, and
the flat fields vLLM's result file holds (completed, request_throughput, mean_ttft_ms,
p99_itl_ms, ...), written beside roseplay's own (summary, requests, runs), so that a
script reading vLLM's files reads roseplay's.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from engine.metrics import percentile

# vLLM's metric names -> the request records' keys (vLLM's e2el is our e2e)
METRICS = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2e"}
DEFAULT_METRICS = ("ttft", "tpot", "itl", "e2el")   # vLLM: ttft,tpot,itl; E2E printed too
DEFAULT_PERCENTILES = (95.0, 99.0)                  # vLLM: 99; the block printed P95 too


def p_word(p: float) -> str:
    """99.0 -> "99", 99.9 -> "99.9": the percentile as vLLM writes it in a key or a row."""
    return str(int(p)) if int(p) == p else str(p)


def _metrics(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in METRICS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"expected some of {','.join(METRICS)}, got {text!r}")
    return names


def _percentiles(text: str) -> tuple[float, ...]:
    try:
        ps = tuple(dict.fromkeys(float(p) for p in text.split(",")))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers such as 50,90,99, got {text!r}") \
            from None
    if not all(0 < p <= 100 for p in ps):     # NaN fails too
        raise argparse.ArgumentTypeError(f"each must be in (0, 100], got {text!r}")
    return ps


_metrics.__name__ = _percentiles.__name__ = "list"


def add_result_flags(group) -> None:
    group.add_argument("--save-result", action="store_true",
                       help="Write the result JSON as vLLM's bench serve does: to --result-dir, "
                            "named BACKEND-RATEqps[-concurrencyN]-MODEL-YYYYmmdd-HHMMSS.json "
                            "(BACKEND: roseplay, or openai / openai-chat with --base-url), or "
                            "--result-filename. It holds vLLM's fields (completed, "
                            "mean_ttft_ms, p99_itl_ms, ...) beside --json's.")
    group.add_argument("--result-dir", metavar="DIR", default=None,
                       help="Folder of --save-result's file (default: the current one).")
    group.add_argument("--result-filename", metavar="NAME", default=None,
                       help="File name of --save-result's file (default: vLLM's name).")
    group.add_argument("--percentile-metrics", type=_metrics, default=DEFAULT_METRICS,
                       metavar="METRICS",
                       help="Latencies reported, comma-separated, of ttft, tpot, itl, e2el "
                            "(default: all four; vLLM's: ttft,tpot,itl).")
    group.add_argument("--metric-percentiles", type=_percentiles, default=DEFAULT_PERCENTILES,
                       metavar="PS",
                       help="Percentiles reported of each latency besides mean and median, "
                            "comma-separated, e.g. 25,50,99.9 (default: 95,99; vLLM's: 99).")


def check_result_flags(args) -> None:
    """--result-dir / --result-filename name --save-result's file: refused without it
    (they were ignored) or with --json (one file, one name)."""
    named = [f for f, v in (("--result-dir", args.result_dir),
                            ("--result-filename", args.result_filename)) if v is not None]
    if named and not args.save_result:
        raise ValueError(f"{', '.join(named)}: where --save-result writes; give --save-result")
    if args.save_result and args.json:
        raise ValueError("--json PATH and --save-result each name the result file: give one")
    if args.save_result:
        from roseplay.cli_checks import check_output_path
        folder = args.result_dir if args.result_dir is not None else "."
        if args.result_dir is not None and not os.path.isdir(folder):
            raise ValueError(f"--result-dir {folder}: no such folder")
        problem = check_output_path("--result-filename" if args.result_filename else
                                    "--result-dir", os.path.join(folder, args.result_filename
                                                                 or "result.json"))
        if problem:
            raise ValueError(problem)


def backend(args) -> str:
    """vLLM's backend name of the run: the in-process engine is roseplay's own."""
    if not args.base_url:
        return "roseplay"
    return "openai-chat" if args.endpoint == "chat" else "openai"


def result_path(args, model: str) -> str | None:
    """--json's path, or --save-result's (vLLM's name), or None."""
    if args.json or not args.save_result:
        return args.json
    if args.result_filename:
        name = args.result_filename
    else:
        rate = "inf" if args.request_rate is None else args.request_rate
        cap = f"-concurrency{args.max_concurrency}" if args.max_concurrency else ""
        name = (f"{backend(args)}-{rate}qps{cap}-{model.split('/')[-1]}-"
                f"{time.strftime('%Y%m%d-%H%M%S')}.json")
    return os.path.join(args.result_dir or ".", name)


def fields(args, requests: list[dict], summary: dict, model: str) -> dict:
    """vLLM's result fields of one run (`requests`: its records, in seconds; `summary`:
    report.summarize's); latencies in ms, 0 for a metric without values, as vLLM's."""
    out = {"date": time.strftime("%Y%m%d-%H%M%S"), "backend": backend(args),
           "model_id": model, "tokenizer_id": model, "num_prompts": args.num_prompts,
           "request_rate": "inf" if args.request_rate is None else args.request_rate,
           "burstiness": args.burstiness, "max_concurrency": args.max_concurrency,
           "duration": summary["duration_s"], "completed": summary["successful_requests"],
           "failed": summary["failed_requests"],
           "total_input_tokens": summary["total_input_tokens"],
           "total_output_tokens": summary["total_output_tokens"],
           "request_throughput": summary["request_throughput"],
           "request_goodput": summary.get("request_goodput"),
           "output_throughput": summary["output_throughput"],
           "total_token_throughput": summary["total_token_throughput"]}
    for name in args.percentile_metrics:
        values = latencies(requests, name)
        ms = [1000 * v for v in values] or [0.0]
        out[f"mean_{name}_ms"] = statistics.fmean(ms)
        out[f"median_{name}_ms"] = statistics.median(ms)
        out[f"std_{name}_ms"] = statistics.pstdev(ms)
        for p in args.metric_percentiles:
            out[f"p{p_word(p)}_{name}_ms"] = percentile(ms, p)
    return out


def latencies(requests: list[dict], name: str) -> list[float]:
    """One metric's values over the records (s): ITL is every gap of every request."""
    key = METRICS[name]
    if key == "itl":
        return [x for r in requests for x in r["itls"]]
    return [r[key] for r in requests if r.get(key) is not None]
