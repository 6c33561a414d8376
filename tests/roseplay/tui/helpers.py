"""Shared helpers for the TUI tests (tests/roseplay/tui/)."""
from __future__ import annotations

import functools
import os
import time

from textual.geometry import Region

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
SESSION = os.path.join(DATA, "tui_session.jsonl.gz")
SIZE = (160, 48)
ENGINE = dict(model="dummy:tiny", device="cpu", num_blocks=96, block_size=16, seed=0)


def live_source(**workload):
    """A small live engine + driver (dummy:tiny on the CPU)."""
    from roseplay.workload.source import start_live
    engine = dict(ENGINE, **workload.pop("engine", {}))
    opts = dict(scenario="shared-prefix", concurrency=4, input_len=48, output_len=24,
                temperature=0.0, seed=0, in_process=True)   # UI behaviour: no process needed
    opts.update(workload)
    return start_live(engine, **opts)


def logprobs_snapshots(max_tokens: int, max_num_seqs: int) -> list:
    """Each step's snapshot of a dummy engine serving 3 prompts that ask for 2 logprobs,
    raw too (their token traces), in 16-token chunks; the last after the final flush."""
    from engine.config import make_config
    from engine.core.core import LLMEngine
    from engine.request import SamplingParams
    from tests.helpers import add_request
    eng = LLMEngine(make_config(model="dummy:tiny", device="cpu", dtype="float32",
                                num_blocks=64, block_size=8, max_num_batched_tokens=16,
                                max_num_seqs=max_num_seqs))
    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True,
                                logprobs=2, raw_logprobs=True)
        for k in range(3):
            add_request(eng, {"prompt_token_ids": list(range(k + 1, k + 30))}, params, f"r{k}")
        out = []
        while eng.has_unfinished():
            eng.step()
            out.append(eng.snapshot())
        eng.flush()
        return out + [eng.snapshot()]
    finally:
        eng.close()


def replay_at_end(path):
    """(source, app) of a paused replay of `path` at its last frame."""
    from roseplay.tui.app import RoseplayApp
    from roseplay.workload.source import ReplaySource
    src = ReplaySource(str(path), start_paused=True)
    src.seek(len(src.recording) - 1)
    return src, RoseplayApp(source=src)


async def select_shown(pilot, app, request_id: str) -> None:
    """Select a request and let the panels show it."""
    app.refresh_panels()
    app.requests.select(request_id)
    app.refresh_panels()
    await pilot.pause()


def widget_text(widget) -> str:
    """What the widget shows on screen now (its rendered lines, border included)."""
    w, h = widget.outer_size
    strips = widget.render_lines(Region(0, 0, w, h))
    return "\n".join(strip.text for strip in strips)


async def wait_for(pilot, predicate, timeout: float = 20.0, interval: float = 0.05) -> bool:
    """Let the app run until `predicate()` holds (False after `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await pilot.pause(interval)
    return bool(predicate())


async def settle(pilot, source, timeout: float = 10.0) -> None:
    """After a pause or step: wait until the published snapshot says so and stops moving."""
    await wait_for(pilot, lambda: source.snapshot().paused, timeout)
    step = -1
    while step != source.snapshot().step:
        step = source.snapshot().step
        await pilot.pause(0.15)


def sync(fn):
    """Run an async test function with asyncio.run (no pytest async plugin needed)."""
    import asyncio
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))
    return wrapper


def fast_idle(monkeypatch) -> None:
    """Textual's Pilot waits after each key until the process *CPU* goes idle (max 1 s);
    a running engine keeps the process busy, so every key would cost ~2 s. A short cap
    keeps the semantics (events are still processed: Pilot also waits for the screen)."""
    import asyncio

    async def wait_for_idle(min_sleep: float = 0.0, max_sleep: float = 1.0) -> None:
        await asyncio.sleep(0.02)

    monkeypatch.setattr("textual.app.wait_for_idle", wait_for_idle)
    monkeypatch.setattr("textual.pilot.wait_for_idle", wait_for_idle)


async def palette_query(pilot, app, query: str) -> None:
    """Open the command palette with `query` in its input at once: a key typed into the
    palette redraws the whole screen (~0.1 CPU-s each); test_tui.py's palette test
    types its queries key by key."""
    from textual.command import CommandInput
    await pilot.press("ctrl+p")
    assert await wait_for(pilot, lambda: bool(app.screen.query(CommandInput)), 30)
    app.screen.query_one(CommandInput).value = query


def screen_text(app) -> str:
    """Every row of the terminal as the user sees it now (all layers composited)."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def seen_in(app, widget) -> str:
    """What the screen shows in the widget's region: its children and border included
    (a container's own render_lines draws neither); one character a cell."""
    r = widget.region
    lines = screen_text(app).splitlines()[r.y:r.y + r.height]
    return "\n".join(line[r.x:r.x + r.width] for line in lines)


def notices(app) -> str:
    """The app's latest messages (the message line's, full texts; toasts before it)."""
    if not hasattr(app, "messages"):
        return "\n".join(n.message for n in app._notifications)
    return "\n".join(text for _, text in app.messages)


class StaticSource:
    """A replay-like source that serves one given snapshot (events built by a test)."""

    kind = "replay"
    paused = True
    at_end = True           # one frame: none comes after it

    def __init__(self, snap, workload: dict | None = None):
        self.snap = snap
        self._workload = workload or {"scenario": "shared-prefix", "concurrency": 8,
                                      "rate": None, "in_flight": 8}

    def snapshot(self):
        return self.snap

    def workload(self) -> dict:
        return self._workload

    @property
    def knobs(self):
        return self.snap.knobs

    def position(self) -> str:
        return "a built snapshot"

    def notice(self):
        return None

    def take_events(self) -> list:
        return []

    def close(self) -> None:
        pass


@functools.lru_cache(maxsize=None)
def session_snapshot(index: int = 12):
    """Frame `index` of the committed session (a paused replay's snapshot). Read once per
    process: opening a recording decodes and checks every frame (~0.1 CPU-s), and a
    snapshot is immutable (tests change copies: dataclasses.replace)."""
    from roseplay.workload.replay import Recording
    return Recording(SESSION)[index].snapshot


async def press_at_random(pilot, app, keys, *, presses: int, seed: int, resize_every: int,
                          sizes) -> None:
    """Seeded key presses with a resize every `resize_every`, then back to 120x40 with
    the panels redrawn: the screen must still be whole and the app running."""
    import random
    rng = random.Random(seed)
    for i in range(presses):
        await pilot.press(rng.choice(keys))
        if i % resize_every == 0:
            await pilot.resize_terminal(*rng.choice(sizes))
    await pilot.press("escape", "escape")
    await pilot.resize_terminal(120, 40)
    await pilot.pause(0.3)
    app.refresh_panels()
    await pilot.pause()
    assert len(screen_text(app).splitlines()) == 40 and app.return_code is None


def steps_then_keys(steps: int, *keys):
    """A snapshot test's run_before: `steps` replay frames fed to the panels one by one
    (the `n` key's action: each frame redrawn from the source) with the screen drawn
    once after them, not after each (a drawn frame costs ~0.1 CPU-s; the `n` key
    itself: test_tui_features.py), then `keys` as keys_redrawing presses them."""
    async def run(pilot):
        pilot.app.refresh_panels()          # the first frame, before any step
        for _ in range(steps):
            pilot.app.action_step()
        await pilot.pause()
        await keys_redrawing(*keys)(pilot)
    return run


def keys_redrawing(*keys):
    """A snapshot test's run_before: press keys one by one, redrawing from the source
    after each: the timing panel's history must see every replay frame, and the app's
    timer may skip frames (or not fire between two presses) on a loaded machine."""
    async def run(pilot):
        pilot.app.refresh_panels()          # the first frame, before any key
        await pilot.pause()
        for key in keys:
            await pilot.press(key)
            pilot.app.refresh_panels()
            await pilot.pause()
    return run
