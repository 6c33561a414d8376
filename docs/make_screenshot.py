"""Regenerate docs/screenshot.svg: the app mid-run on the bundled model (CPU), or with
--compare, docs/screenshot_compare.svg: the side-by-side screen (120x40).

    python docs/make_screenshot.py [--model default] [--seconds 24] [--compare]

Serves the app's default workload (scenario mixed, 32 in flight over max_num_seqs 16,
roseplay/cli.py), picks guide 6 (the prefix cache off) until its scorecard has measured
it, turns the cache on (the key the card names: it then measures guide 5's setup), and
saves the screen: the scorecard with both sides measured, the plots marked at each
change.
"""
import argparse
import asyncio
import os
import time

from roseplay.tui.app import RoseplayApp
from roseplay.tui.defaults import TUI_CONCURRENCY, TUI_MAX_NUM_SEQS, TUI_NUM_BLOCKS, TUI_SCENARIO
from roseplay.workload.source import start_live

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "screenshot.svg")
OUT_COMPARE = os.path.join(HERE, "screenshot_compare.svg")


async def until(pilot, ready, limit: float) -> None:
    """Let the app run until `ready()` (or `limit` s: a loaded machine is slower)."""
    deadline = time.monotonic() + limit
    while not ready() and time.monotonic() < deadline:
        await pilot.pause(0.5)


async def shoot(model: str, seconds: float) -> None:
    """The default workload for a while, then guide 6 (the prefix cache off) until its
    scorecard has measured its claim, then `c`, the key the card names: the card then
    measures guide 5's setup and shows the comparison."""
    src = start_live(dict(model=model, device="cpu", num_blocks=TUI_NUM_BLOCKS,
                          max_num_seqs=TUI_MAX_NUM_SEQS), scenario=TUI_SCENARIO,
                     concurrency=TUI_CONCURRENCY, temperature=0.8)
    app = RoseplayApp(source=src)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause(seconds * 0.4)
        app.pick_guide("6")
        await until(pilot, lambda: "6" in app.guide_results, 120)
        await pilot.press("c")                # guide 5's setup: the card measures it
        await until(pilot, lambda: "5" in app.guide_results, 120)
        await pilot.pause(seconds * 0.2)
        app.save_screenshot(OUT)
    src.close()
    print(f"wrote {OUT}")


async def shoot_compare(model: str, seconds: float) -> None:
    """`roseplay --compare enable_prefix_caching=true,false --goodput ttft:1000 tpot:150`
    on shared prefixes: two engine processes, one workload stream."""
    from roseplay.tui.compare import start_compare
    from roseplay.tui.compare_app import CompareApp
    src = start_compare(dict(model=model, device="cpu", num_blocks=512,
                             max_num_batched_tokens=128), "enable_prefix_caching",
                        [True, False], scenario="shared-prefix", concurrency=8, rate=None,
                        input_len=64, output_len=32, temperature=0.8)
    app = CompareApp(source=src, slos={"ttft": 1000.0, "tpot": 150.0})
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(seconds)
        app.save_screenshot(OUT_COMPARE)
    src.close()
    print(f"wrote {OUT_COMPARE}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--seconds", type=float, default=24.0)
    ap.add_argument("--compare", action="store_true", help="the side-by-side screen")
    args = ap.parse_args()
    asyncio.run((shoot_compare if args.compare else shoot)(args.model, args.seconds))
