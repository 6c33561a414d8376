"""When the core loop (engine/core/core_loop.py) builds snapshots. Unwatched: only when
its state changed (it went idle after steps, a command ran), never on its idle ticks;
watched: also periodically while idle. Counted at the engine's snapshot(); the idle
ticks are counted by the EngineStats the idle loop publishes (one a second)."""
from __future__ import annotations

import time

from engine.front.loop import EngineLoop
from engine.request import SamplingParams


def _count_builds(loop: EngineLoop) -> list:
    builds = []
    real = loop.engine.snapshot

    def counted(*args, **kwargs):
        builds.append(1)
        return real(*args, **kwargs)
    loop.engine.snapshot = counted
    return builds


def _idle_stats(loop: EngineLoop, count: int, timeout: float = 60.0) -> None:
    """Wait for `count` more EngineStats of the idle loop (each a second of idle ticks)."""
    seen, deadline = loop.engine_stats().time, time.monotonic() + timeout
    while count and time.monotonic() < deadline:
        if loop.engine_stats().time != seen:
            seen, count = loop.engine_stats().time, count - 1
        time.sleep(0.01)
    assert count == 0, "the idle loop published no stats"


def test_an_unwatched_loop_builds_snapshots_only_when_its_state_changed():
    with EngineLoop(model="dummy:tiny", device="cpu", num_blocks=64) as loop:
        loop.watch(False)
        assert loop.wait_idle(60)
        builds = _count_builds(loop)
        _idle_stats(loop, 2)
        assert builds == [], "idle ticks built snapshots nobody watches"
        params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
        loop.submit([1, 2, 3], params).result(timeout=60)
        assert loop.wait_idle(60)
        assert len(builds) == 1             # on going idle: the state after the last step
        loop.set_knobs(max_num_seqs=3)
        assert loop.wait_idle(60)
        assert len(builds) == 2 and loop.snapshot().knobs.max_num_seqs == 3
        _idle_stats(loop, 1)
        assert len(builds) == 2
        loop.watch(True)
        _idle_stats(loop, 1)
        assert len(builds) > 2, "a watched idle loop stopped refreshing its snapshot"


def test_a_paused_watched_loop_republishes_its_state_once_a_second_not_per_tick():
    """Paused, nothing changes but by a command or a step (each publishes at once), so
    the idle ticks only publish the same state again every PAUSED_REPUBLISH (a late or
    dropped subscriber still gets it): about once per idle-stats second, not at the UI's
    rate. A loaded machine only makes fewer of them."""
    with EngineLoop(model="dummy:tiny", device="cpu", num_blocks=64) as loop:
        loop.watch(True)
        loop.pause()
        assert loop.wait_idle(60)
        builds = _count_builds(loop)
        _idle_stats(loop, 3)
        assert 1 <= len(builds) <= 5, builds
        seen = len(builds)
        loop.set_knobs(max_num_seqs=3)       # a command: published at once
        assert loop.wait_idle(60)
        assert len(builds) > seen and loop.snapshot().knobs.max_num_seqs == 3
        assert loop.snapshot().paused


def test_a_build_that_waits_does_not_postpone_the_next_snapshot():
    """A build stretched by waiting (for the GIL or a loaded CPU) costs the engine no CPU:
    the next snapshot stays due at the usual rate. Its wall time once counted as cost,
    and 1 s of waiting put the next snapshot 33 s away (a TUI frozen mid-lesson)."""
    with EngineLoop(model="dummy:tiny", device="cpu", num_blocks=64) as loop:
        loop.pause()
        assert loop.wait_idle(60)
        builds, real = [], loop.engine.snapshot

        def waits_once(*args, **kwargs):
            builds.append(1)
            if len(builds) == 1:
                time.sleep(1.5)          # a wait, not work
            return real(*args, **kwargs)
        loop.engine.snapshot = waits_once
        loop.set_knobs(max_num_seqs=3)   # a command publishes at once: the slow build
        deadline = time.monotonic() + 20
        while len(builds) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(builds) >= 2, "the periodic republish waited 1.5 s / SNAPSHOT_BUDGET"
        assert loop.snapshot().knobs.max_num_seqs == 3
