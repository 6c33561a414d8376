"""The engine process's own hygiene, set up once at start: it dies with its parent (no
orphan engines), and garbage collection is timed, frozen after start-up and run when the
engine goes idle rather than mid-burst."""
from __future__ import annotations

import ctypes
import gc
import signal
import time


def die_with_parent() -> None:
    """Ask Linux to SIGTERM this process when its parent dies (no orphan engines)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def time_collections(counters) -> None:
    """Count this process's garbage-collection pauses (counters.gc_pause_us: a pause stops
    the engine thread) and freeze what start-up built (model, tokenizer, kernels) out of
    every later collection, as serving engines do after warm-up."""
    started = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            counters.gc_pause_us += int((time.perf_counter() - started[0]) * 1e6)
    gc.collect()
    gc.freeze()
    gc.callbacks.append(on_gc)


IDLE_COLLECT_EVERY = 2.0   # seconds: the least time between two idle-time collections


def collect_when_idle():
    """A full collection each time the engine goes idle (at most every IDLE_COLLECT_EVERY
    s): the young generations a burst left behind are collected between bursts, not in
    the middle of the next one (a 30-60 ms pause in a 0.5 s burst is a tenth of it)."""
    last = [0.0]

    def collect() -> None:
        now = time.monotonic()
        if now - last[0] >= IDLE_COLLECT_EVERY:
            last[0] = now
            gc.collect()
    return collect
