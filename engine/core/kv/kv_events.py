"""The engine's KV cache events as they happen: blocks entering a tier's prefix index
(stored), leaving it (removed: evicted, or the host tier cleared), and the whole cache
cleared.

The engine thread only appends small lists here (the blocks' hashes, the parent's, the
keys that hold their tokens, the tier's medium); once per step `flush` hands the step's
events, numbered, to a sink (engine/ipc/kv_publisher.py), whose thread unpacks the
tokens, builds vLLM's event structs, encodes and sends them. Consecutive stored blocks of
one chain and tier (a request's new full blocks) merge into one event, as vLLM's
BlockStored carries several. With events off the engine holds no recorder: nothing here
runs.
"""
from __future__ import annotations

import time
from typing import Callable

STORED, REMOVED, CLEARED = "stored", "removed", "cleared"


class KVEventRecorder:
    """Raw events between flushes, in order: [STORED, hashes, parent, keys, medium],
    [REMOVED, hashes, medium], [CLEARED]."""

    def __init__(self, sink: Callable[[int, float, list], None] | None = None):
        self.sink = sink           # sink(seq, ts, events): set by whoever publishes
        self.pending: list[list] = []
        self.seq = -1              # the last batch's sequence number (-1: none yet)

    def stored(self, block_hash: int, parent: int | None, key: bytes, medium: str) -> None:
        self.stored_chain([block_hash], parent, [key], medium)

    def stored_chain(self, hashes: list[int], parent: int | None, keys: list[bytes],
                     medium: str) -> None:
        """Blocks indexed in chain order (each one's parent the one before it); the lists
        become the event's."""
        pending = self.pending
        if pending:
            last = pending[-1]
            if last[0] is STORED and last[1][-1] == parent and last[4] == medium:
                last[1].extend(hashes)         # the same chain goes on
                last[3].extend(keys)
                return
        pending.append([STORED, hashes, parent, keys, medium])

    def removed(self, hashes: list[int], medium: str) -> None:
        if hashes:
            self.pending.append([REMOVED, hashes, medium])

    def cleared(self) -> None:
        self.pending.append([CLEARED])

    def flush(self) -> None:
        """Hand the pending events to the sink as the next batch (none: no batch)."""
        if not self.pending:
            return
        events, self.pending = self.pending, []
        self.seq += 1
        if self.sink is not None:
            self.sink(self.seq, time.time(), events)
