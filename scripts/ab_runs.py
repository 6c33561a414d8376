"""Shared by the CPU A/B scripts: run one measurement per tree, trees interleaved
(A B A B ...), so a shared machine's load hits both alike; report medians with min..max
and the load average around the runs."""
from __future__ import annotations

import os
import statistics
from typing import Callable


def spread(xs: list[float], fmt: str = ".1f") -> str:
    return f"median {statistics.median(xs):{fmt}} ({min(xs):{fmt}}..{max(xs):{fmt}})"


def interleaved(trees: list[str], runs: int, measure: Callable[[str], dict]) -> dict:
    """{tree: {metric: [values]}}; measure(tree) returns one run's {metric: value}."""
    out: dict = {t: {} for t in trees}
    for i in range(runs):
        for tree in trees:
            for k, v in measure(tree).items():
                out[tree].setdefault(k, []).append(v)
            print(f"  run {i + 1}/{runs} {tree}: load {os.getloadavg()[0]:.2f}", flush=True)
    return out
