"""`roseplay bench`'s command line: its flags (workload, bench modes, the HTTP client,
then every engine knob), `--ab KNOB=V1,V2,...` parsed, and the values no run could use
refused before any engine starts. The runs themselves: roseplay/bench/inproc.py.
"""
from __future__ import annotations

import argparse

from roseplay.cli_flags import (add_engine_address_flag, add_engine_flags, add_engine_key_flag,
                                add_goodput_flag, engine_addresses, engine_kwargs, parse_ab)
from roseplay.bench.vllm_result import add_result_flags, check_result_flags
from roseplay.workload.flags import add_workload_flags, number

MAX_PROMPTS = 10 ** 7      # the workload is built as a list before the run
HF_BATCH_SIZE = 64


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    w = p.add_argument_group("workload (EOS ignored)")
    rate = add_workload_flags(w, "bench")
    rate.add_argument("--submit-interval-ms", type=number(float, 0), default=None,
                      help="One request every MS milliseconds (0: all at once).")
    w.add_argument("--burstiness", type=number(float, 0, strict=True), default=1.0,
                   help="Shape of the gaps between --request-rate's arrivals, as vLLM's bench "
                        "draws them (gamma, mean 1/rate): 1 is Poisson, below 1 burstier "
                        "(requests come in clumps), above 1 more even (default: 1).")
    w.add_argument("--num-prompts", type=number(int, 1, MAX_PROMPTS), default=64,
                   help="Measured requests (default: 64).")
    w.add_argument("--range-ratio", "--random-range-ratio", type=_range_ratio, default=0.0,
                   help="Lengths uniform in [L*(1-r), L*(1+r)] (default: 0).")
    for flag, dest in (("--random-input-len", "input_len"), ("--random-output-len", "output_len")):
        w.add_argument(flag, dest=dest, type=number(int, 1), default=argparse.SUPPRESS,
                       help=f"vLLM bench serve's name for --{dest.replace('_', '-')}.")
    w.add_argument("--dataset-name", dest="scenario", type=_dataset, default=argparse.SUPPRESS,
                   help="vLLM bench serve's name for --scenario: its random dataset is "
                        "the random scenario; its other datasets are not built in.")
    w.add_argument("--ignore-eos", action="store_true", default=True,   # (recorded as done)
                   help="Taken from vLLM's command lines: the bench's requests ignore EOS "
                        "whether it is given or not (each makes its max_tokens).")
    w.add_argument("--warmup", type=number(int, 0, MAX_PROMPTS), default=8, help="Warm-up requests of the same scenario "
                   "(other seed), run and discarded before each measured run; the prefix "
                   "cache is cleared after them (default: 8).")
    b = p.add_argument_group("bench")
    b.add_argument("--ab", metavar="KNOB=V1,V2,...", type=_ab_flag, help="Run once per knob value; "
                   "side-by-side table with ratios vs the first.")
    b.add_argument("--compare", choices=["hf"], help="Also run HF transformers (continuous "
                   "batching and plain generate) on the same workload and weights.")
    b.add_argument("--hf-batch-size", type=number(int, 1), default=None,
                   help=f"Batch of HF plain generate, with --compare hf (default: "
                        f"{HF_BATCH_SIZE}).")
    b.add_argument("--repeat", type=number(int, 1), default=1, help="Measured runs on one engine (prefix "
                   "cache cleared before each); prints every run's report, then each run's "
                   "throughput and the median with min..max; --json's summary is the last "
                   "run's (default: 1).")
    b.add_argument("--in-process", action="store_true", help="Run the engine on a thread of "
                   "this process instead of its own process (the old architecture).")
    add_engine_address_flag(b)
    add_engine_key_flag(b)
    add_goodput_flag(b)
    b.add_argument("--json", metavar="PATH", help="Write summary + per-request details "
                   "(and vLLM's result fields, as --save-result).")
    add_result_flags(b)
    b.add_argument("--no-progress", "--disable-tqdm", action="store_true",
                   help="No progress bar.")
    h = p.add_argument_group("HTTP client (roseplay/bench/http.py)")
    h.add_argument("--base-url", metavar="URL", help="Drive an OpenAI-compatible server at URL "
                   "(roseplay serve, vLLM, SGLang) instead of the in-process engine; engine "
                   "flags then only name the model (--model: the tokenizer and model name).")
    h.add_argument("--api-key", default=None, help="Bearer key for --base-url.")
    h.add_argument("--endpoint", type=_endpoint, default="completions",
                   metavar="{completions,chat}",
                   help="/v1/completions (token-id prompts sent as ids) or "
                        "/v1/chat/completions; vLLM's paths name them too (default: "
                        "completions).")
    h.add_argument("--backend", dest="endpoint", type=_backend, default=argparse.SUPPRESS,
                   metavar="{vllm,openai,openai-chat}",
                   help="vLLM bench serve's name for the endpoint: vllm and openai are "
                        "completions, openai-chat is chat.")
    h.add_argument("--host", default=None, help="vLLM bench serve's server address: with "
                   "--port, --base-url http://HOST:PORT (default host: 127.0.0.1).")
    h.add_argument("--port", type=number(int, 1, 65535), default=None,
                   help="See --host (default port: 8000).")
    h.add_argument("--num-clients", type=number(int, 1), default=1, metavar="N",
                   help="Client processes sharing the load and one report: request i goes "
                        "to process i %% N, each keeps its share of --max-concurrency. One "
                        "process reads a few 10k SSE chunks/s; the report prints each run's "
                        "client CPU (a busiest process near 100 %% of a core is the limit) "
                        "(default: 1).")
    add_engine_flags(p)
    return p


def _range_ratio(text: str) -> float:
    """[0, 1), as vLLM's --random-range-ratio: a length L*(1-r) must stay positive."""
    value = number(float, 0)(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


_range_ratio.__name__ = "float"

ENDPOINT_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


def _endpoint(text: str) -> str:
    """completions or chat; vLLM's --endpoint paths name them."""
    names = {**{n: n for n in ENDPOINT_PATHS}, **{p: n for n, p in ENDPOINT_PATHS.items()}}
    if text not in names:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(names)}, got {text!r}")
    return names[text]


BACKENDS = {"vllm": "completions", "openai": "completions", "openai-chat": "chat"}


def _backend(text: str) -> str:
    """vLLM's --backend of an OpenAI-compatible server: the endpoint it drives."""
    if text not in BACKENDS:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(BACKENDS)} (the "
                                         f"OpenAI-compatible ones), got {text!r}")
    return BACKENDS[text]


def _dataset(text: str) -> str:
    """vLLM's --dataset-name: random is the random scenario; the rest are not built in."""
    from roseplay.workload.scenarios import SCENARIOS
    if text not in SCENARIOS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not built in: random (vLLM's random dataset), or a scenario of "
            f"--scenario: {', '.join(SCENARIOS)}")
    return text


_endpoint.__name__ = _dataset.__name__ = _backend.__name__ = "str"


def _ab_flag(text: str) -> str:
    """--ab's argparse type: the text, once it parses, so that a bad value is argparse's
    error naming the flag (`argument --ab: ...`), as every other flag's."""
    try:
        if parse_ab(text) is None:
            raise ValueError(f"expected KNOB=V1,V2,..., got {text!r}")
    except ValueError as exc:         # InvalidRequestError is one
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


_ab_flag.__name__ = "str"


# engine knobs the HTTP bench reads itself: the model's name and tokenizer, the workload's seed
CLIENT_KNOBS = ("model", "seed")


def server_root(url: str) -> str:
    """--base-url without a trailing / or /v1: the bench adds /v1/... itself, and OpenAI
    clients' base URLs end in /v1 (it asked for /v1/v1/models)."""
    url = url.rstrip("/")
    return url.removesuffix("/v1") if url.endswith("/v1") else url


SECRET_FLAGS = ("api_key", "engine_key")


def recorded_args(args) -> dict:
    """The flags as `--json` records them: without the function and the secrets (a
    result file is shared; the engine key and the API key are not)."""
    return {k: v for k, v in vars(args).items() if k != "func" and k not in SECRET_FLAGS}


def check_args(args) -> None:
    """Refuses flag combinations no run could use (a clear error before any engine
    starts); each flag's own range is its argparse type's."""
    if args.host is not None or args.port is not None:     # vLLM's spelling of --base-url
        if args.base_url:
            raise ValueError("--host / --port and --base-url each name the server: give one")
        args.base_url, args.host, args.port = (
            f"http://{args.host or '127.0.0.1'}:{args.port or 8000}", None, None)
    if args.ab and args.compare:
        raise ValueError("use --ab or --compare, not both")
    if args.base_url and (args.ab or args.compare):
        raise ValueError("--ab and --compare need the in-process engine (drop --base-url)")
    client_only = [flag for flag, given in (("--api-key", args.api_key is not None),
                                            ("--endpoint", args.endpoint != "completions"),
                                            ("--num-clients", args.num_clients > 1)) if given]
    if client_only and not args.base_url:
        raise ValueError(f"{', '.join(client_only)}: HTTP client flags, they need --base-url "
                         "(the bench drives its own engine without it)")
    if args.base_url:
        args.base_url = server_root(args.base_url)
        engine_only = [flag for flag, given in (("--in-process", args.in_process),
                                                ("--engine-address", args.engine_address),
                                                ("--engine-key", args.engine_key)) if given]
        engine_only += ["--" + k.replace("_", "-") for k in engine_kwargs(args)
                        if k not in CLIENT_KNOBS]
        if engine_only:        # each was ignored: the server's engine is set where it starts
            raise ValueError(f"{', '.join(engine_only)}: the engine's own flags, not with "
                             "--base-url (the server's engine is set where it starts)")
    if args.burstiness != 1.0 and args.request_rate is None:   # it shapes a rate's gaps
        raise ValueError("--burstiness shapes the gaps of --request-rate: give a rate "
                         "(without one every request is sent at once)")
    check_result_flags(args)
    if args.hf_batch_size is not None and args.compare != "hf":
        raise ValueError("--hf-batch-size sets HF's batch: it needs --compare hf")
    if args.repeat > 1 and (args.ab or args.compare):
        raise ValueError("--repeat works with a single configuration (not --ab / --compare)")
    address, attached = engine_addresses(args)
    if attached and (args.in_process or args.compare or args.ab):
        raise ValueError("--engine-address given more than once attaches to running engines: "
                         "not with --in-process / --compare / --ab (their settings are fixed)")
    if address and (args.in_process or args.compare):   # it was silently not bound
        raise ValueError("--engine-address binds the engine's own process: not with "
                         "--in-process / --compare hf (the engine runs in this process)")
