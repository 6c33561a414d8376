"""Record a live session to a file and read it back (for `--record` / `--replay`).

Format: gzipped JSON lines. Line 1 is a header; then, in time order, `frame` lines
(one engine snapshot, ~10 per second) and `event` lines (knob changes, key actions).
Frames are deltas against the previous frame so that a long session stays small:

* block arrays (`bs` int8 states, `rc` int32 refcounts) as base64, only when changed;
* requests: the id order when it changed, full views of new requests, changed fields of
  known ones (text as an appended suffix `text+`);
* recent steps / latencies / ITLs: only the entries added since the last frame;
* counters, knobs, workload, extra, error: only when changed.

Replay decodes every frame up front into `EngineSnapshot`s that share unchanged parts,
and imports no torch (engine.snapshot and engine.config are torch-free).
"""
from __future__ import annotations

import base64
import dataclasses
import gzip
import json
import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from engine.config import SchedulerConfig
from engine.events import MAX_EVENTS
from engine.snapshot import (ChunkInfo, EngineCounters, EngineEvent, EngineSnapshot, RequestView,
                             StepStats)

FORMAT_VERSION = 1
RECENT_STEPS, RECENT_SAMPLES = 256, 2048     # what a live snapshot keeps (engine/stats.py)
_REQ_FIELDS = tuple(f.name for f in dataclasses.fields(RequestView))
_STEP_FIELDS = tuple(f.name for f in dataclasses.fields(StepStats))


def _b64(arr: np.ndarray, dtype: str) -> str:
    return base64.b64encode(np.ascontiguousarray(arr, dtype=dtype).tobytes()).decode("ascii")


def _unb64(text: str, dtype: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype=dtype)


def _req_dict(view: RequestView) -> dict:
    d = {name: getattr(view, name) for name in _REQ_FIELDS}
    d["blocks"] = list(view.blocks)
    return d


def _step_dict(step: StepStats) -> dict:
    d = {name: getattr(step, name) for name in _STEP_FIELDS}
    d["prefill_chunks"] = [[c.request_id, c.start, c.num_tokens, c.total] for c in step.prefill_chunks]
    return d


def _step_from(d: dict) -> StepStats:
    d = dict(d)
    d["prefill_chunks"] = tuple(ChunkInfo(*c) for c in d["prefill_chunks"])
    return StepStats(**d)


class FrameEncoder:
    """Turns successive snapshots into compact delta dicts."""

    def __init__(self):
        self._last: dict = {}
        self._reqs: dict[str, dict] = {}
        self._order: list[str] = []
        self._step = -1
        self._lat_t = self._itl_t = float("-inf")
        self._ev_key = (-1, float("-inf"))

    def encode(self, snap: EngineSnapshot, t: float, workload: dict) -> dict:
        frame: dict = {"kind": "frame", "t": round(t, 4), "time": snap.time, "step": snap.step,
                       "paused": snap.paused}
        self._changed(frame, "knobs", dataclasses.asdict(snap.knobs))
        self._changed(frame, "workload", workload)
        self._changed(frame, "counters", dataclasses.asdict(snap.counters))
        self._changed(frame, "extra", dict(snap.extra))
        self._changed(frame, "error", snap.error)
        self._changed(frame, "bs", _b64(snap.block_state, "<i1"))
        self._changed(frame, "rc", _b64(snap.block_refcount, "<i4"))
        self._requests(frame, snap.requests)
        steps = [s for s in snap.recent_steps if s.step > self._step]
        if steps:
            frame["steps"] = [_step_dict(s) for s in steps]
            self._step = steps[-1].step
        lat = [x for x in snap.recent_latencies if x[0] > self._lat_t]
        if lat:
            frame["lat"], self._lat_t = [list(x) for x in lat], lat[-1][0]
        itl = [x for x in snap.recent_itls if x[0] > self._itl_t]
        if itl:
            frame["itl"], self._itl_t = [list(x) for x in itl], itl[-1][0]
        ev = [e for e in snap.events if (e.step, e.time) > self._ev_key]
        if ev:
            frame["ev"] = [dataclasses.astuple(e) for e in ev]
            self._ev_key = (ev[-1].step, ev[-1].time)
        return frame

    def _changed(self, frame: dict, key: str, value) -> None:
        if key not in self._last or self._last[key] != value:
            frame[key] = self._last[key] = value

    def _requests(self, frame: dict, views) -> None:
        order = [v.request_id for v in views]
        if order != self._order:
            frame["order"] = self._order = order
        new, upd, known = {}, {}, {}
        for v in views:
            d = _req_dict(v)
            old = self._reqs.get(v.request_id)
            known[v.request_id] = d
            if old is None:
                new[v.request_id] = d
            elif old != d:
                upd[v.request_id] = _req_delta(old, d)
        self._reqs = known
        if new:
            frame["new"] = new
        if upd:
            frame["upd"] = upd


def _req_delta(old: dict, new: dict) -> dict:
    delta = {k: v for k, v in new.items() if old.get(k) != v}
    text = delta.pop("text", None)
    if text is not None:
        prev = old.get("text") or ""
        if text.startswith(prev):
            delta["text+"] = text[len(prev):]
        else:
            delta["text"] = text
    return delta


@dataclass
class ReplayFrame:
    t: float
    snapshot: EngineSnapshot
    workload: dict
    events: tuple[dict, ...] = ()


class FrameDecoder:
    """Rebuilds full snapshots from a header and a stream of delta frames."""

    def __init__(self, header: dict):
        self.header = header
        self._state: dict = {"knobs": {}, "workload": {}, "counters": {}, "extra": {},
                             "error": None}
        self._bs = np.zeros(header["num_blocks"], np.int8)
        self._rc = np.zeros(header["num_blocks"], np.int32)
        self._views: dict[str, RequestView] = {}
        self._dicts: dict[str, dict] = {}
        self._order: list[str] = []
        self._steps: deque = deque(maxlen=RECENT_STEPS)
        self._lat: deque = deque(maxlen=RECENT_SAMPLES)
        self._itl: deque = deque(maxlen=RECENT_SAMPLES)
        self._ev: deque = deque(maxlen=MAX_EVENTS)

    def decode(self, frame: dict) -> tuple[EngineSnapshot, dict]:
        for key in ("knobs", "workload", "counters", "extra", "error"):
            if key in frame:
                self._state[key] = frame[key]
        if "bs" in frame:
            self._bs = _unb64(frame["bs"], "<i1")
        if "rc" in frame:
            self._rc = _unb64(frame["rc"], "<i4")
        self._decode_requests(frame)
        self._steps.extend(_step_from(s) for s in frame.get("steps", ()))
        self._lat.extend(tuple(x) for x in frame.get("lat", ()))
        self._itl.extend(tuple(x) for x in frame.get("itl", ()))
        self._ev.extend(EngineEvent(e[0], e[1], e[2], e[3], tuple(e[4]), e[5])
                        for e in frame.get("ev", ()))
        h, s = self.header, self._state
        snap = EngineSnapshot(
            time=frame["time"], step=frame["step"], model=h["model"], device=h["device"],
            dtype=h["dtype"], knobs=SchedulerConfig(**s["knobs"]), paused=frame["paused"],
            num_blocks=h["num_blocks"], block_size=h["block_size"], block_state=self._bs,
            block_refcount=self._rc, requests=tuple(self._views[r] for r in self._order),
            last_step=self._steps[-1] if self._steps else None,
            recent_steps=tuple(self._steps), counters=EngineCounters(**s["counters"]),
            recent_latencies=tuple(self._lat), recent_itls=tuple(self._itl),
            error=s["error"], extra=dict(s["extra"]), events=tuple(self._ev))
        return snap, s["workload"]

    def _decode_requests(self, frame: dict) -> None:
        if "order" in frame:
            self._order = frame["order"]
        for rid, d in frame.get("new", {}).items():
            self._set_view(rid, dict(d))
        for rid, delta in frame.get("upd", {}).items():
            d = dict(self._dicts[rid])
            delta = dict(delta)
            if "text+" in delta:
                d["text"] = (d.get("text") or "") + delta.pop("text+")
            d.update(delta)
            self._set_view(rid, d)
        live = set(self._order)
        for rid in [r for r in self._dicts if r not in live]:
            del self._dicts[rid], self._views[rid]

    def _set_view(self, rid: str, d: dict) -> None:
        self._dicts[rid] = d
        self._views[rid] = RequestView(**{**d, "blocks": tuple(d["blocks"]),
                                          "output_tail": tuple(d.get("output_tail", ()))})


def header_for(snap: EngineSnapshot, **info) -> dict:
    return {"kind": "header", "version": FORMAT_VERSION, "created": time.time(),
            "model": snap.model, "device": snap.device, "dtype": snap.dtype,
            "num_blocks": snap.num_blocks, "block_size": snap.block_size, **info}


def load_recording(path: str) -> tuple[dict, list[ReplayFrame]]:
    """Read and decode a whole recording (header, frames with the events before each)."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        lines = (json.loads(line) for line in fh if line.strip())
        header = next(lines, None)
        if not header or header.get("kind") != "header":
            raise ValueError(f"{path}: not a roseplay recording (no header line)")
        if header.get("version") != FORMAT_VERSION:
            raise ValueError(f"{path}: recording format {header.get('version')} is not supported")
        decoder, frames, pending = FrameDecoder(header), [], []
        for line in lines:
            if line.get("kind") == "event":
                pending.append(line)
            elif line.get("kind") == "frame":
                snap, workload = decoder.decode(line)
                frames.append(ReplayFrame(line["t"], snap, workload, tuple(pending)))
                pending = []
    if not frames:
        raise ValueError(f"{path}: the recording holds no frames")
    return header, frames


class Recorder:
    """Samples `snapshot_fn()` at `interval` seconds on its own thread and writes frames.

    Never touches the engine: it only reads the published snapshot. `event()` may be
    called from any thread (knob changes, pauses); events are written before the next
    frame. `close()` writes a final frame and closes the file.
    """

    def __init__(self, path: str, snapshot_fn, workload_fn, interval: float = 0.1, **info):
        self.path = path
        self._snapshot_fn, self._workload_fn = snapshot_fn, workload_fn
        self.interval = interval
        self._fh = gzip.open(path, "wt", encoding="utf-8", compresslevel=6)
        self._encoder = FrameEncoder()
        self._events: deque = deque()
        self._t0 = time.perf_counter()
        self._last_snap = None
        self._last_workload = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.frames = 0
        self._write(header_for(snapshot_fn(), **info))
        self._thread = threading.Thread(target=self._run, name="roseplay-recorder", daemon=True)
        self._thread.start()

    def event(self, what: str, **data) -> None:
        self._events.append({"kind": "event", "t": round(time.perf_counter() - self._t0, 4),
                             "what": what, **data})

    def _write(self, obj: dict) -> None:
        self._fh.write(json.dumps(obj, separators=(",", ":")) + "\n")

    def capture(self, force: bool = False) -> None:
        with self._lock:
            if self._fh.closed:
                return
            snap, workload = self._snapshot_fn(), self._workload_fn()
            while self._events:
                self._write(self._events.popleft())
            if not force and snap is self._last_snap and workload == self._last_workload:
                return
            self._last_snap, self._last_workload = snap, workload
            self._write(self._encoder.encode(snap, time.perf_counter() - self._t0, workload))
            self.frames += 1

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
                self._fh.close()
