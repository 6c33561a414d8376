"""The workload flags of `roseplay` (the app's driver) and `roseplay bench`, defined once.

Each command's defaults stand side by side in WORKLOAD_DEFAULTS, so a difference is a
choice made here, not drift between two parsers: the app shows a lively, chat-like mix
(text scenarios, sampling) through a closed loop of requests in flight; bench follows
vLLM's benchmark_serving (its random dataset: token-id prompts, greedy, every request
sent at t = 0 unless a rate or a concurrency cap is given).
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from engine.validation import MAX_TEMPERATURE, MAX_TOKENS
from roseplay.workload.scenarios import SCENARIOS


@dataclass(frozen=True)
class WorkloadDefaults:
    scenario: str
    input_len: int
    output_len: int
    temperature: float
    concurrency: int | None     # requests in flight at most (None: no cap)
    concurrency_flag: str       # the app says --concurrency, bench vLLM's --max-concurrency
    rate_flag: str              # the app says --rate, bench vLLM's --request-rate


WORKLOAD_DEFAULTS = {
    "roseplay": WorkloadDefaults("mixed", 64, 64, 0.8, 32, "--concurrency", "--rate"),
    "bench": WorkloadDefaults("random", 128, 64, 0.0, None, "--max-concurrency",
                              "--request-rate"),
}


def number(kind: type, low: float, high: float | None = None, *, strict: bool = False,
           hint: str = ""):
    """An argparse type: an int/float >= low (> low if strict), <= high if given, finite."""
    def convert(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind.__name__}, got {text!r}") from None
        if not math.isfinite(value) or value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(
                f"must be {'>' if strict else '>='} {low:g}, got {text}{hint}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be <= {kind(high)}, got {text}")
        return value
    convert.__name__ = kind.__name__
    return convert


def add_workload_flags(group, command: str):
    """--scenario, --input-len, --output-len, --temperature, the concurrency cap and the
    arrival rate, with `command`'s defaults; returns the group holding the rate flag
    (mutually exclusive: bench adds --submit-interval-ms to it)."""
    d = WORKLOAD_DEFAULTS[command]
    group.add_argument("--scenario", default=d.scenario, choices=list(SCENARIOS),
                       help=f"Workload scenario (default: {d.scenario}). " + " ".join(
                           f"{s.name}: {s.description}" for s in SCENARIOS.values()))
    group.add_argument("--input-len", type=number(int, 1), default=d.input_len,
                       help="Prompt tokens of token-id prompts (the random scenario, dummy "
                            f"models); text scenarios use their own text (default: {d.input_len}).")
    group.add_argument("--output-len", type=number(int, 1, MAX_TOKENS), default=d.output_len,
                       help=f"max_tokens per workload request (default: {d.output_len}).")
    group.add_argument("--temperature", type=number(float, 0, MAX_TEMPERATURE),
                       default=d.temperature,
                       help="Sampling temperature of workload requests, 0: greedy "
                            f"(default: {d.temperature:g}).")
    cap = "none" if d.concurrency is None else d.concurrency
    group.add_argument(d.concurrency_flag, type=number(int, 1), default=d.concurrency,
                       help="Most requests in flight; a new one is sent as soon as one "
                            f"finishes (default: {cap}).")
    rate = group.add_mutually_exclusive_group()
    rate.add_argument(d.rate_flag, type=_rate, default=None,
                      help="Poisson arrivals per second, under the concurrency cap; inf or "
                           "none: send whenever a slot is free (default: none).")
    return rate


_positive = number(float, 0, strict=True, hint=" (leave it out to send whenever a slot frees)")


def _rate(text: str) -> float | None:
    """Arrivals per second > 0; inf (vLLM's spelling of no limit) is None."""
    if text.strip().lower() in ("inf", "none"):
        return None
    return _positive(text)


_rate.__name__ = "float"
