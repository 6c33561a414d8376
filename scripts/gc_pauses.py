"""Shared by the measurement scripts: the garbage collections a block of code ran."""
from __future__ import annotations

import gc
import time
from contextlib import contextmanager


@contextmanager
def gc_pauses():
    """Yields a list that receives (generation, seconds) of every collection that ends
    inside the block."""
    pauses, started = [], [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.append((info["generation"], time.perf_counter() - started[0]))
    gc.callbacks.append(on_gc)
    try:
        yield pauses
    finally:
        gc.callbacks.remove(on_gc)
