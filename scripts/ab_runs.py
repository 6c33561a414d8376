"""Shared by the CPU A/B scripts: run one measurement per tree, trees interleaved
(A B A B ...), so a shared machine's load hits both alike; report medians with min..max
and the load average around the runs. Each run is a fresh Python process in its tree
(`run_in_tree`), so every tree measures its own code."""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from typing import Callable

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # this checkout


def add_tree_args(parser: argparse.ArgumentParser, runs: int = 5) -> None:
    """--runs and --trees, as every A/B script takes them."""
    parser.add_argument("--runs", type=int, default=runs, help="rounds over --trees")
    parser.add_argument("--trees", nargs="+", default=[HERE], metavar="DIR",
                        help="checkouts to compare (interleaved; default: this one)")


def run_in_tree(tree: str, argv: list[str], timeout: float = 900, **env: str) -> str:
    """stdout of `python argv...` run in `tree` with only that tree on PYTHONPATH (env:
    more variables); a failed run ends the comparison with its stderr."""
    out = subprocess.run([sys.executable, *argv], cwd=tree, capture_output=True, text=True,
                         timeout=timeout,
                         env={**os.environ, "PYTHONPATH": os.path.abspath(tree), **env})
    if out.returncode:
        raise SystemExit(f"{tree}: run failed\n{out.stderr[-3000:]}")
    return out.stdout


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
