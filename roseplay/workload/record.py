"""Record a live session to a file and read it back (for `--record` / `--replay`).

Format: gzipped JSON lines. Line 1 is a header; then, in time order, `frame` lines
(one engine snapshot, ~10 per second, encoded as deltas by roseplay/workload/frames.py) and
`event` lines (knob changes, key actions).

The recorder flushes the gzip stream every second, so a killed session leaves a file
that replays up to its last flush. Replay (`Recording`) reads the file once, checking
every line as untrusted data (roseplay/workload/record_schema.py), and keeps the *encoded* frames;
a frame is decoded when shown, from the nearest keyframe before it, so memory holds
the compact deltas, not one full snapshot per frame. No torch is imported.
"""
from __future__ import annotations

import gzip
import json
import os
import threading
import time
import zlib
from collections import deque

from engine.snapshot import EngineSnapshot
from roseplay.workload.frames import FrameEncoder
from roseplay.workload.record_replicas import ReplicaEncoder
from roseplay.workload.record_text import PieceTracker, TextTracker

FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)           # version 1: no keyframes, no engine events
FLUSH_EVERY = 1.0                    # seconds between gzip flushes (what a kill -9 keeps)
MAX_RECORDING_BYTES = 256 << 20      # uncompressed JSON a recorder writes / a replay keeps


def header_for(snap: EngineSnapshot, **info) -> dict:
    return {"kind": "header", "version": FORMAT_VERSION, "created": time.time(),
            "model": snap.model, "device": snap.device, "dtype": snap.dtype,
            "num_blocks": snap.num_blocks, "block_size": snap.block_size, **info}


class Recorder:
    """Samples `snapshot_fn()` at `interval` seconds on its own thread and writes frames.

    Never touches the engine: it only reads the published snapshot. `event()` may be
    called from any thread (knob changes, pauses); events are written before the next
    frame. The gzip stream is flushed every FLUSH_EVERY seconds (a killed process leaves
    a readable prefix); past `max_bytes` of JSON it stops and sets `full`. A write that
    fails (disk full, the file's disk gone) stops it too, with `error` saying why: the
    session goes on unrecorded, and the file replays up to its last flush. `close()`
    writes a final frame and closes the file. With the engine's `tokenizer`, each
    request's generated text is recorded too (the header says `"text": true`), and the
    text of each token the frames show (record_text.py `PieceTracker`). With
    `replicas_fn` giving a data-parallel front, each replica's frames and the router's
    too (record_replicas.py).
    """

    def __init__(self, path: str, snapshot_fn, workload_fn, interval: float = 0.1,
                 max_bytes: int = MAX_RECORDING_BYTES, tokenizer=None, replicas_fn=None,
                 **info):
        self.path = path
        self._snapshot_fn, self._workload_fn = snapshot_fn, workload_fn
        self.interval, self.max_bytes = interval, max_bytes
        self._fh = gzip.open(path, "wt", encoding="utf-8", compresslevel=6)
        self._encoder = FrameEncoder()
        self._events: deque = deque()
        self._t0 = time.perf_counter()
        self._flushed = self._t0
        self._last_snap = None
        self._last_workload = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.frames = self.bytes = 0
        self.full = False
        self.error: str | None = None
        # the generated text, decoded here: a replay loads no tokenizer (record_text.py)
        self._text = TextTracker(tokenizer) if tokenizer is not None else None
        self._pieces = PieceTracker(tokenizer) if tokenizer is not None else None
        # data parallelism: each replica's frames and the router's (record_replicas.py)
        self._dp = replicas_fn() if replicas_fn is not None else None
        self._replicas = ReplicaEncoder() if self._dp is not None else None
        if self._dp is not None:
            info["replica_blocks"] = [s.num_blocks for s in self._dp.replica_snapshots()]
        self._write(header_for(snapshot_fn(), text=self._text is not None, **info))
        self._thread = threading.Thread(target=self._run, name="roseplay-recorder", daemon=True)
        self._thread.start()

    def event(self, what: str, **data) -> None:
        self._events.append({"kind": "event", "t": round(time.perf_counter() - self._t0, 4),
                             "what": what, **data})

    def _write(self, obj: dict) -> None:
        line = json.dumps(obj, separators=(",", ":")) + "\n"
        self.bytes += len(line)
        self._fh.write(line)

    def capture(self, force: bool = False) -> None:
        with self._lock:
            if self._fh.closed or self.full:
                return
            try:
                self._capture(force)
            except OSError as exc:
                self._give_up(exc)

    def _give_up(self, exc: OSError) -> None:
        self.error = exc.strerror or str(exc)
        self.full = True
        try:
            self._fh.close()          # may fail again (its last buffer): nothing more to do
        except OSError:
            pass

    def _capture(self, force: bool) -> None:
        replicas, snap = self._read()
        workload = self._workload_fn()
        while self._events:
            self._write(self._events.popleft())
        if not force and snap is self._last_snap and workload == self._last_workload:
            return
        self._last_snap, self._last_workload = snap, workload
        frame = self._encoder.encode(snap if self._text is None else self._text.with_text(snap),
                                     time.perf_counter() - self._t0, workload)
        pieces = self._pieces.new_pieces(snap) if self._pieces is not None else None
        if pieces:
            frame["pieces"] = pieces
        if replicas is not None:
            frame["dp"] = self._replicas.encode(self._dp, replicas, frame["t"],
                                                bool(frame.get("key")))
        self._write(frame)
        self.frames += 1
        now = time.perf_counter()
        if now - self._flushed >= FLUSH_EVERY:
            self._fh.flush()        # a sync flush: everything so far is decodable
            self._flushed = now
        if self.bytes >= self.max_bytes:
            self.full = True
            self._fh.close()

    def _read(self) -> tuple[list | None, EngineSnapshot]:
        """The replicas' snapshots (None: one engine) and the merged one made of the same
        ones: each replica publishes its own, so one that arrives between the two reads
        (the last frame's cancellations) is read again, not recorded beside an older merge."""
        if self._dp is None:
            return None, self._snapshot_fn()
        for _ in range(3):
            replicas = self._dp.replica_snapshots()
            snap = self._snapshot_fn()
            if all(a is b for a, b in zip(replicas, self._dp.replica_snapshots())):
                break
        return replicas, snap

    def file_bytes(self) -> int:
        """The gzipped file's size on disk (up to its last flush), what the REC badge shows:
        `bytes` counts the uncompressed JSON, for the size limit."""
        try:
            return os.path.getsize(self.path)
        except OSError:
            return 0

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.capture()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(2.0)
        self.capture(force=True)
        with self._lock:
            if not self._fh.closed:
                try:
                    self._fh.close()
                except OSError as exc:
                    self._give_up(exc)


def iter_lines(path: str):
    """(line, None) for each line of a gzipped file, then (None, why) if it ends early."""
    try:
        with gzip.open(path, "rt", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                yield line, None
    except EOFError:
        yield None, "the file ends early (the recording was cut off)"
    except (OSError, zlib.error) as exc:
        yield None, f"the file is damaged from here on ({exc})"
