"""The prompts a viewer typed into a live source: their streams, and their token traces.

A snapshot carries only the engine's latest few traces (engine/core/stats.py
TRACE_KEEP of each kind), so under a busy workload a typed prompt's trace can leave the
window before the app pulls a snapshot. A typed prompt therefore asks for its own
(SamplingParams.token_trace): its final output carries it, and `merge` adds the latest
KEEP of them to each snapshot the source hands out, so the app, a recording and a
compare side see them whatever else ended beside them.
"""
from __future__ import annotations

import dataclasses
import queue
import threading
from collections import OrderedDict

from roseplay.workload.driver import PROCESS_TAG

OWN_PREFIX = "you-"        # every typed prompt's id starts so (this process's or another's)


def own_request_id(n: int) -> str:
    """This process's n-th typed prompt's request id, `you-kqf-1`: the per-process tag of
    the workload's ids (roseplay/workload/driver.py PROCESS_TAG) keeps two apps attached
    to one engine apart, which refuses an id live for another client (both sent you-1)."""
    return f"{OWN_PREFIX}{PROCESS_TAG}-{n}"


def short_own_id(request_id: str) -> str:
    """A typed prompt's id without its tag (`you…-1`), for a narrow id column: its end
    alone (`…kqf-1`) would read like the workload's `w0kqf-1`."""
    head, tag, n = request_id[len(OWN_PREFIX):].rpartition("-")
    return f"{OWN_PREFIX[:-1]}…-{n}" if tag and head else request_id


class OwnPrompts:
    """The typed prompts' streams (a dropped stream cancels its request: they are kept
    until they end) and the latest KEEP of their traces. The app's thread and a
    recorder's both read through it, hence the lock."""

    KEEP = 16

    def __init__(self):
        self._lock = threading.Lock()
        self._streams: dict = {}
        self._traces: OrderedDict = OrderedDict()
        self._version = 0                     # traces kept so far (a change: merge anew)
        self._merged: tuple | None = None     # (engine snapshot, version, merged snapshot)

    def add(self, request_id: str, stream) -> None:
        with self._lock:
            self._streams[request_id] = stream

    def drain(self) -> None:
        """Read what the streams hold; keep the traces of those that ended."""
        with self._lock:
            for rid, stream in list(self._streams.items()):
                try:
                    while not stream.get(timeout=0).finished:
                        pass
                except queue.Empty:
                    continue
                del self._streams[rid]
                trace = stream.output.trace
                if trace is not None:
                    self._traces[rid] = trace
                    self._version += 1
                    while len(self._traces) > self.KEEP:
                        self._traces.popitem(last=False)

    def merge(self, snap):
        """`snap` with the typed prompts' traces it lacks after its own (the same object
        while neither changed, so a reader can tell nothing is new)."""
        with self._lock:
            last = self._merged
            if last is not None and last[0] is snap and last[1] == self._version:
                return last[2]
            have = {t.request_id for t in snap.traces}
            extra = tuple(t for t in self._traces.values() if t.request_id not in have)
            merged = dataclasses.replace(snap, traces=snap.traces + extra) if extra else snap
            self._merged = (snap, self._version, merged)
            return merged
