"""Regenerate docs/screenshot.svg: the app mid-run on the bundled model (CPU).

    python docs/make_screenshot.py [--model default] [--seconds 24]

Serves shared-prefix with a 128-token budget (so prompts are chunked), turns the prefix
cache off for a while and back on (the TTFT curve shows it), then saves the screen.
"""
import argparse
import asyncio
import os

from roseplay.app import RoseplayApp
from roseplay.source import start_live

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "screenshot.svg")


async def shoot(model: str, seconds: float) -> None:
    src = start_live(dict(model=model, device="cpu", num_blocks=512, max_num_batched_tokens=128),
                     scenario="shared-prefix", concurrency=16, temperature=0.8)
    app = RoseplayApp(source=src)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause(seconds * 0.45)
        await pilot.press("c")                # prefix cache off ...
        await pilot.pause(seconds * 0.3)
        await pilot.press("c")                # ... and on again
        await pilot.pause(seconds * 0.25)
        app.save_screenshot(OUT)
    src.close()
    print(f"wrote {OUT}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--seconds", type=float, default=24.0)
    args = ap.parse_args()
    asyncio.run(shoot(args.model, args.seconds))
