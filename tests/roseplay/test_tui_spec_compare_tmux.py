"""Guide d's two halves on screen, side by side: the real `roseplay --compare
num_speculative_tokens=0,3 --scenario repetitive --concurrency 1` (the compare command
the guide's help line gives) in tmux at 120x40. At 1 in flight the B / A row shows
speculation's TPOT p50 below the spec-off side's; after `concurrency 16` (command
palette) and a stats reset (`0`), its output tok/s below. The B / A table is what a
user reads, so the test reads it too, once each side has finished SETTLED requests in
the window (about 15 s: two engines on one workload)."""
from __future__ import annotations

import re
import shutil
import sys

import pytest

from roseplay.guides import BY_KEY
from tests.roseplay.tmux import Tmux

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")]

PALETTE = "Search for commands"     # the command palette's prompt, while it is open
RATIOS = re.compile(r"B/A +(\S+) +(\S+) +(\S+)")   # TTFT p50, TPOT p50, tok/s of B / A
DONE = re.compile(r"([\d,]+) req done in 10 s")    # each side's Timing panel
SETTLED = 40        # requests finished on each side in the window before a ratio is read


def ratio(screen: str, column: int) -> float:
    """B / A of a column of the B / A row (1: TTFT p50, 2: TPOT p50, 3: output tok/s)."""
    m = RATIOS.search(screen)
    assert m and re.fullmatch(r"×\d+\.\d+", m.group(column)), screen
    return float(m.group(column)[1:])


def settled(screen: str) -> bool:
    done = [int(n.replace(",", "")) for n in DONE.findall(screen)]
    return len(done) == 2 and min(done) >= SETTLED and RATIOS.search(screen) is not None


def test_speculation_lowers_tpot_at_one_in_flight_and_throughput_at_sixteen(tmp_path):
    guide = BY_KEY["d"]
    command = [sys.executable, "-m", "roseplay", "--compare", guide.compare,
               "--scenario", guide.scenario, "--concurrency", str(guide.concurrency)]
    tmux = Tmux(command, str(tmp_path / "exit_code"))
    try:
        screen = tmux.wait(settled, 90)
        assert ratio(screen, 2) < 1.0, screen           # TPOT p50: k = 3 below k = 0
        tmux.keys("C-p")
        tmux.wait(lambda t: PALETTE in t, 10)
        tmux.keys("concurrency 16")
        tmux.wait(lambda t: "concurrency 16" in t, 10)
        tmux.keys("Enter")
        tmux.wait(lambda t: PALETTE not in t and "concurrency 16" not in t, 10)
        tmux.keys("0")                      # reset: the window holds 16 in flight only
        tmux.wait(lambda t: "reset hit" in t, 10)     # the KV panels' totals since it
        screen = tmux.wait(settled, 60)
        assert ratio(screen, 3) < 1.0, screen           # output tok/s: k = 3 below k = 0
        tmux.keys("q")
        assert tmux.exit_code() == "0"
    finally:
        tmux.kill()
