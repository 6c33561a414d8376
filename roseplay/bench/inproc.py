"""`roseplay bench`: a vLLM-benchmark_serving-style benchmark of the engine (in its own
process; --in-process: on a thread of this one; --base-url: a server's).

The engine runs in its own process behind an EngineClient (--in-process: an EngineLoop
thread; the TUI's streaming front either way); a WorkloadDriver
submits a scenario's work items (burst, --submit-interval-ms or Poisson
--request-rate, optional --max-concurrency) and the timings are the engine's own token
timestamps (TTFT from submission). --warmup N requests run first and are excluded.

--ab KNOB=V1,V2,...: the same workload once per value. Live knobs (SchedulerConfig:
enable_prefix_caching, max_num_batched_tokens, max_num_seqs) reuse ONE engine: knob set,
prefix cache cleared, warm-up, cache cleared again, measured. Fixed knobs (EngineConfig)
build a fresh engine per value. --compare hf: see roseplay/bench/hf_compare.py.

    python -m roseplay.bench.inproc --model dummy:tiny --num-prompts 64 --input-len 32 --output-len 16
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import weakref

from rich.console import Console
from rich.progress import Progress

from engine.config import SchedulerConfig
from roseplay.bench import report, vllm_result
from roseplay.bench.args import (HF_BATCH_SIZE, add_arguments, check_args, parse_ab,
                                 recorded_args)
from roseplay.bench.common import (arrivals as _arrivals, host_cpu, progress as _progress,
                                   summary_options, traffic_lines, workload_items)
from roseplay.cli_flags import (OneLineParser, engine_addresses, engine_kwargs, say_on_stderr,
                                usage_error)
from roseplay.workload.driver import WorkloadDriver
from roseplay.workload.items import WorkItem

LIVE_KNOBS = {f.name for f in dataclasses.fields(SchedulerConfig)}


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("bench", help="Benchmark the engine (vLLM benchmark_serving style).",
                              description=__doc__.split("\n\n")[0])
    add_arguments(p)
    p.set_defaults(func=run)
    return p


# -- one measured run ---------------------------------------------------------------------
def make_loop(args, **overrides):
    """The engine the bench drives: its own process (the default: the bench's driver and
    front never share the engine's GIL), or a thread of this one (--in-process; needed by
    --compare hf, which shares weights with HF in-process)."""
    kwargs = engine_kwargs(args, **overrides)
    if args.in_process or args.compare:
        from engine.front.loop import EngineLoop
        # nobody watches snapshots during a benchmark: publish them rarely
        return EngineLoop(snapshot_interval=0.5, **kwargs)
    from engine.front.dp_client import engine_front
    address, attached = engine_addresses(args)
    if address:
        print(f"engine listening at {address}: watch it with "
              f"`roseplay --connect {address}`", file=sys.stderr)
    progress = say_on_stderr("roseplay bench") if attached else None
    return engine_front(address=address, engine_addresses=attached, label="bench",
                        snapshots=bool(address), engine_key=args.engine_key,
                        on_progress=progress, **kwargs)


class Interrupted(Exception):
    """Ctrl-C during a run: `result` is the part of the measured run that finished
    (None if the interrupt came before it started)."""

    def __init__(self, result: report.RunResult | None = None, driver=None):
        super().__init__("interrupted")
        self.result, self.driver = result, driver


def _drive(loop, items, args, *, arrivals: dict, progress: Progress | None = None,
           description: str = "") -> WorkloadDriver:
    """Run `items` to the end; on Ctrl-C cancel what is in flight and raise Interrupted
    with the driver (whose finished outputs the caller may still report)."""
    driver = WorkloadDriver(loop, items, concurrency=args.max_concurrency,
                            num_requests=len(items), seed=args.seed or 0, **arrivals).start()
    task = progress.add_task(description, total=len(items)) if progress else None
    try:
        while not driver.wait(0.1):
            if progress:
                progress.update(task, completed=driver.completed + driver.failed)
    except KeyboardInterrupt:
        driver.stop()
        raise Interrupted(driver=driver) from None
    if progress:
        progress.update(task, completed=driver.completed + driver.failed)
    return driver


def _fresh_cache(loop) -> None:
    loop.reset_prefix_cache()
    loop.wait_idle()


def measure(loop, items: list[WorkItem], warmup: list[WorkItem], args, label: str,
            progress: Progress | None = None) -> tuple[report.RunResult, list]:
    """Warm up, clear the prefix cache, run `items`; returns the result and the outputs
    in submission order."""
    loop.wait_idle()
    _fresh_cache(loop)
    if warmup:
        _drive(loop, warmup, args, arrivals={}, progress=progress, description=f"{label} warm-up")
        loop.wait_idle()
        _fresh_cache(loop)
    loop.reset_peak_usage()
    loop.wait_idle()
    snap0 = loop.snapshot()
    pos0 = loop.engine_stats().spec_decode_num_accepted_tokens_per_pos
    reps0 = loop.replica_snapshots() if hasattr(loop, "replica_snapshots") else None
    try:
        driver = _drive(loop, items, args, arrivals=_arrivals(args), progress=progress,
                        description=label)
    except Interrupted as exc:
        loop.wait_idle(5.0)
        result, _ = _result(loop, exc.driver, snap0, f"{label} (interrupted)".strip(),
                            finished_only=True, pos0=pos0, reps0=reps0)
        raise Interrupted(result) from None
    loop.wait_idle()
    return _result(loop, driver, snap0, label, pos0=pos0, reps0=reps0)


def _result(loop, driver: WorkloadDriver, snap0, label: str, finished_only: bool = False,
            pos0: tuple = (), reps0: list | None = None) -> tuple[report.RunResult, list]:
    """The run's result from the driver's outputs (`finished_only`: an interrupted run,
    whose cancelled requests are left out)."""
    snap1 = loop.snapshot()
    stats = report.engine_stats(snap0, snap1)
    stats["spec_decode"] = report.spec_decode_stats(
        stats, pos0, loop.engine_stats().spec_decode_num_accepted_tokens_per_pos)
    outputs = sorted(driver.outputs, key=lambda o: driver.submission_index(o.request_id))
    if finished_only:
        outputs = [o for o in outputs if o.outputs[0].finish_reason != "cancelled"]
    records = [report.request_record(o) for o in outputs if o.error is None]
    wall = report.wall_duration(records)
    # the engine thread either works on the host or waits for the GPU at the step's sync
    engines = getattr(loop, "size", 1)     # data parallelism: every replica waits apart
    stats["host_share"] = max(0.0, 1 - stats["device_wait_us"] / 1e6 / wall / engines) \
        if wall else 0.0
    if reps0 is not None:           # data parallelism: each replica's share
        from roseplay.bench.replicas import replica_figures
        stats["data_parallel"] = replica_figures(loop, records, reps0,
                                                 loop.replica_snapshots(), wall)
    # why requests failed: refused at submit, or ended with an error (a failing step)
    errors = driver.submit_errors + [o.error for o in outputs if o.error is not None]
    for err in errors[:3]:
        print(f"request failed: {err}", file=sys.stderr)
    result = report.RunResult(label, wall, records, stats, dict(dataclasses.asdict(loop.knobs)),
                              failed=driver.failed, steps=report.step_records(snap0, snap1))
    return result, outputs


# -- the command ---------------------------------------------------------------------------
def _workload(loop, args) -> tuple[list[WorkItem], list[WorkItem]]:
    return workload_items(args, loop.tokenizer, loop.info.vocab_size)


def _run_ab(args, console: Console, ab, results: list) -> dict:
    knob, values = ab
    loop = None
    try:
        with _progress(console, args) as progress:
            for value in values:
                if knob in LIVE_KNOBS:
                    loop = loop or make_loop(args)
                    loop.set_knobs(**{knob: value})
                else:
                    loop = make_loop(args, **{knob: value})
                items, warmup = _workload(loop, args)
                result, _ = measure(loop, items, warmup, args, f"{knob}={value}", progress)
                results.append(result)
                if knob not in LIVE_KNOBS:
                    loop.close()
    finally:
        if loop is not None:
            loop.close()
    mode = "same engine, knob set live, prefix cache cleared" if knob in LIVE_KNOBS \
        else "fresh engine per value"
    return {"knob": knob, "values": values, "mode": mode}


def _run_compare(args, console: Console, results: list) -> dict:
    from roseplay.bench import hf_compare
    loop = make_loop(args)
    try:
        engine = loop.engine
        device, dtype = engine.device, engine.dtype
        hf_model = hf_compare.build_hf_model(engine.model_name, dtype, args.seed or 0)
        if engine.model_name.startswith("dummy:"):
            hf_compare.share_weights(hf_model, engine)
        items, warmup = _workload(loop, args)
        budget = engine.knobs.max_num_batched_tokens
        with _progress(console, args) as progress:
            ours, outputs = measure(loop, items, warmup, args, "roseplay", progress)
        results.append(ours)
    finally:
        loop.close()
    alive = weakref.ref(engine)
    del loop, engine
    hf_compare.free_device_memory()
    if alive() is not None:
        console.print("[yellow]warning: our engine is still referenced; HF runs with its "
                      "KV pool still allocated[/yellow]")
    prompts = [list(o.prompt_token_ids) for o in outputs if o.error is None]
    max_new = [it.params.max_tokens for it, o in zip(items, outputs) if o.error is None]
    hf_model.to(device)
    if _arrivals(args)["request_rate"] or args.submit_interval_ms:
        console.print("[yellow]note: HF requests all arrive at t=0 (burst); ours followed "
                      "the requested arrival process[/yellow]")
    console.print("[dim]running HF continuous batching...[/dim]")
    cb, cb_tokens = hf_compare.run_hf_cb(hf_model, prompts, max_new, device, budget)
    console.print("[dim]running HF generate...[/dim]")
    gen = hf_compare.run_hf_generate(hf_model, prompts, max_new, device,
                                     args.hf_batch_size or HF_BATCH_SIZE)
    ours_tokens = [list(o.outputs[0].token_ids) for o in outputs if o.error is None]
    results += [cb, gen]
    return {"device": str(device), "dtype": str(dtype).removeprefix("torch."),
            "greedy_agreement_vs_hf_cb": hf_compare.agreement(ours_tokens, cb_tokens)}


def _run_single(args, console: Console, results: list) -> dict:
    """One engine; warm-up once, then `--repeat` measured runs (cache cleared before each)."""
    loop = make_loop(args)
    try:
        items, warmup = _workload(loop, args)
        with _progress(console, args) as progress:
            for i in range(args.repeat):
                label = f"run {i + 1}/{args.repeat}" if args.repeat > 1 else ""
                result, _ = measure(loop, items, warmup if i == 0 else [], args, label, progress)
                results.append(result)
    finally:
        loop.close()
    return {}


def _report(console: Console, args, results, extra: dict, mode: str) -> None:
    summaries = [report.summarize(r, **summary_options(args)) for r in results]
    if mode == "single":          # every --repeat run, as the HTTP bench prints them
        for result, summary in zip(results, summaries):
            report.print_summary(console, result, summary)
    elif mode == "ab":
        console.print(f"A/B of {extra['knob']} ({extra['mode']})")
        console.print(report.side_by_side(f"--ab {args.ab}", [str(v) for v in extra["values"]], summaries))
    else:
        report.print_summary(console, results[0], summaries[0])
        console.print(report.side_by_side("roseplay vs HF transformers (ratio vs roseplay)",
                                          [r.label for r in results], summaries))
        ours, cb = summaries[0], summaries[1]
        console.print(f"output throughput roseplay / HF CB: x{report.ratio(ours['output_throughput'], cb['output_throughput']):.2f}; "
                      f"TTFT p50 HF CB / roseplay: x{report.ratio(cb['ttft_ms']['median'], ours['ttft_ms']['median']):.2f}; "
                      f"greedy token agreement: {100 * extra['greedy_agreement_vs_hf_cb']:.0f} %",
                      highlight=False)
    path = vllm_result.result_path(args, _model(args))
    if path:
        main = -1 if mode == "single" else 0    # the last --repeat run (as the HTTP
        payload = {"bench": recorded_args(args),  # bench's), else the first: the baseline
                   "mode": mode, "summary": summaries[main], "requests": results[main].requests,
                   "runs": [report.run_payload(r, s) for r, s in zip(results, summaries)]}
        payload[mode if mode != "single" else "info"] = extra
        payload.update(vllm_result.fields(args, results[main].requests, summaries[main],
                                          _model(args)))
        report.dump_json(path, payload)
        console.print(f"wrote {path}")


def _model(args) -> str:
    return args.model or "default"


def run(args: argparse.Namespace) -> int:
    console = Console()
    try:
        check_args(args)
        ab = parse_ab(args.ab)
    except ValueError as exc:      # one line on stderr, as argparse's own errors
        print(usage_error("roseplay bench", str(exc)), file=sys.stderr)
        return 2
    if args.base_url:
        from roseplay.bench import http as bench_http   # lazy: the in-process bench needs no httpx
        return bench_http.run(args, console)
    console.print(traffic_lines(args), highlight=False)
    t0 = time.perf_counter()
    mode = "ab" if ab else ("compare" if args.compare == "hf" else "single")
    results: list[report.RunResult] = []
    try:
        if ab:
            extra = _run_ab(args, console, ab, results)
        elif args.compare == "hf":
            extra = _run_compare(args, console, results)
        else:
            extra = _run_single(args, console, results)
    except (KeyboardInterrupt, Interrupted) as exc:
        return _interrupted(console, args, results, getattr(exc, "result", None), t0)
    _report(console, args, results, extra, mode)
    if len(results) > 1 and mode == "single":
        report.print_repeats(console, results, host_cpu())
    console.print(f"[dim]total wall time {time.perf_counter() - t0:.1f} s[/dim]")
    return 0 if all(r.failed == 0 for r in results) else 1


def _interrupted(console: Console, args, results: list, partial, t0: float) -> int:
    """Ctrl-C: the engine is closed by now; report what was measured, exit 130 (SIGINT)."""
    if partial is not None and partial.requests:
        results.append(partial)
    model = _model(args)
    report.print_interrupted(console, results, time.perf_counter() - t0,
                             vllm_result.result_path(args, model), {"bench": recorded_args(args)},
                             summary_options(args),
                             lambda reqs, summary: vllm_result.fields(args, reqs, summary, model))
    return 130


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="roseplay bench", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
