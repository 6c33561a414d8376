"""The frame codec of a recording (roseplay/workload/record.py): successive engine snapshots as
compact delta dicts, and back.

A frame is a delta against the previous one, with a full *keyframe* (`"key": true`)
every KEYFRAME_EVERY frames:

* block arrays (`bs` int8 states, `rc` int32 refcounts) as base64, only when changed;
* requests: the id order when it changed, full views of new requests, changed fields of
  known ones (text as an appended suffix `text+`);
* recent steps / latencies / ITLs / TTFT splits (`ttft`) / engine events (`ev`): only
  those added since the last frame;
* token traces (`tr`: new ones, base64 arrays) and their order (`tro`) when it changed;
* counters, knobs, workload, extra, error: only when changed.

The decoder checks every value as untrusted data (roseplay/workload/record_schema.py). No torch is
imported.
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
from collections import deque
from dataclasses import dataclass

import numpy as np

from engine.config import SchedulerConfig
from engine.outputs import TokenLogprobs, TokenTrace
from engine.snapshot import (RUNTIME_FIELDS, ChunkInfo, EngineCounters, EngineEvent, EngineSnapshot, RequestView,
                             StepStats)
from roseplay.workload import record_schema as schema
from roseplay.workload.record_schema import BadRecording

RECENT_STEPS, RECENT_SAMPLES = 256, 2048     # what a live snapshot keeps (engine/core/stats.py)
RECENT_EVENTS = 256
KEYFRAME_EVERY = 100                 # frames (~10 s at 10 Hz)
_REQ_FIELDS = tuple(f.name for f in dataclasses.fields(RequestView))
_STEP_FIELDS = tuple(f.name for f in dataclasses.fields(StepStats))
_EVENT_FIELDS = tuple(f.name for f in dataclasses.fields(EngineEvent))
_TRACE_ARRAYS = ("token_ids", "times", "origin", "logprobs", "raw_logprobs")


def _b64(arr: np.ndarray, dtype: str) -> str:
    return base64.b64encode(np.ascontiguousarray(arr, dtype=dtype).tobytes()).decode("ascii")


def _unb64(text, dtype: str, n: int) -> np.ndarray:
    try:
        arr = np.frombuffer(base64.b64decode(text, validate=True), dtype=dtype)
    except (binascii.Error, TypeError, ValueError):
        raise BadRecording("block array: not base64 of the right type") from None
    if len(arr) != n:
        raise BadRecording(f"block array of {len(arr)} entries for a pool of {n}")
    return arr


def _req_dict(view: RequestView) -> dict:
    d = {name: getattr(view, name) for name in _REQ_FIELDS if name != "grammar"}
    d["blocks"] = list(view.blocks)
    d["output_tail"] = list(view.output_tail)
    lp = view.logprobs      # TokenLogprobs as [token_ids, logprobs, rank]
    d["logprobs"] = None if lp is None else [list(lp.token_ids), list(lp.logprobs), lp.rank]
    return d


def _step_dict(step: StepStats) -> dict:
    d = {name: getattr(step, name) for name in _STEP_FIELDS}
    d["prefill_chunks"] = [[c.request_id, c.start, c.num_tokens, c.total]
                           for c in step.prefill_chunks]
    return d


def _step_from(d: dict) -> StepStats:
    d = dict(schema.check_step(d))
    d["prefill_chunks"] = tuple(ChunkInfo(*c) for c in d["prefill_chunks"])
    return StepStats(**{k: d[k] for k in _STEP_FIELDS})


def _trace_dict(t: TokenTrace) -> dict:
    d = {"request_id": t.request_id, "num_tokens": t.num_tokens, "top": t.top}
    d.update((name, base64.b64encode(getattr(t, name)).decode("ascii"))
             for name in _TRACE_ARRAYS)
    return d


def _trace_from(d) -> TokenTrace:
    d = schema.check_trace(d)
    try:
        arrays = {name: base64.b64decode(d[name], validate=True) for name in _TRACE_ARRAYS}
    except (binascii.Error, TypeError, ValueError):
        raise BadRecording("token trace: an array that is not base64") from None
    trace = TokenTrace(d["request_id"], d["num_tokens"], top=d["top"], **arrays)
    schema.check_trace_arrays(trace)
    return trace


def _event_dict(e: EngineEvent) -> dict:
    d = {name: getattr(e, name) for name in _EVENT_FIELDS}
    d["blocks"] = list(e.blocks)
    return d


class FrameEncoder:
    """Turns successive snapshots into compact delta dicts (a keyframe now and then)."""

    def __init__(self, keyframe_every: int = KEYFRAME_EVERY):
        self.keyframe_every = keyframe_every
        self.count = 0
        self._reset()

    def _reset(self) -> None:
        self._last: dict = {}
        self._reqs: dict[str, dict] = {}
        self._order: list[str] = []
        self._step = -1
        self._lat_t = self._itl_t = self._ttft_t = float("-inf")
        self._events: set = set()
        self._traces: tuple = ()

    def encode(self, snap: EngineSnapshot, t: float, workload: dict,
               key: bool | None = None) -> dict:
        """The frame of `snap`; `key` (a replica's stream, record_replicas.py) makes it a
        keyframe or not whatever the count, so its keyframes fall on the merged one's."""
        frame: dict = {"kind": "frame", "t": round(t, 4), "time": snap.time, "step": snap.step,
                       "paused": snap.paused}
        if key if key is not None else self.count % self.keyframe_every == 0:
            self._reset()
            frame["key"] = True
        self.count += 1
        self._changed(frame, "knobs", dataclasses.asdict(snap.knobs))
        self._changed(frame, "workload", workload)
        self._changed(frame, "counters", dataclasses.asdict(snap.counters))
        self._changed(frame, "extra", {f: getattr(snap, f) for f in RUNTIME_FIELDS})
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
        parts = [x for x in snap.recent_ttft_parts if x[0] > self._ttft_t]
        if parts:
            frame["ttft"], self._ttft_t = [list(x) for x in parts], parts[-1][0]
        events = [e for e in snap.events if e not in self._events]
        if events:
            frame["ev"] = [_event_dict(e) for e in events]
        self._events = set(snap.events)
        self._trace_delta(frame, snap.traces)
        return frame

    def _trace_delta(self, frame: dict, traces: tuple) -> None:
        """New traces in full; the order of those kept when it changed."""
        if traces == self._traces and not frame.get("key"):
            return
        known = {t.request_id: t for t in self._traces}     # (an id a client used again:
        new = [_trace_dict(t) for t in traces if known.get(t.request_id) != t]  # sent again)
        if new:
            frame["tr"] = new
        frame["tro"] = [t.request_id for t in traces]
        self._traces = traces

    def _changed(self, frame: dict, key: str, value) -> None:
        if key not in self._last or self._last[key] != value:
            frame[key] = self._last[key] = value

    def _requests(self, frame: dict, views) -> None:
        order = [v.request_id for v in views]
        if order != self._order or frame.get("key"):
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
    replicas: object = None     # a data-parallel session's RecordedFront (record_replicas.py)


class FrameDecoder:
    """Rebuilds full snapshots from a header and a stream of delta frames, checking
    every value (BadRecording); a keyframe starts from a clean state."""

    def __init__(self, header: dict):
        self.header = schema.check_header(header)
        self._reset()

    def _reset(self) -> None:
        n = self.header["num_blocks"]
        self._state: dict = {"knobs": None, "workload": {}, "counters": None, "extra": {},
                             "error": None}
        self._bs, self._rc = np.zeros(n, np.int8), np.zeros(n, np.int32)
        self._views: dict[str, RequestView] = {}
        self._dicts: dict[str, dict] = {}
        self._order: list[str] = []
        self._steps: deque = deque(maxlen=RECENT_STEPS)
        self._lat: deque = deque(maxlen=RECENT_SAMPLES)
        self._itl: deque = deque(maxlen=RECENT_SAMPLES)
        self._events: deque = deque(maxlen=RECENT_EVENTS)
        self._ttft_parts: deque = deque(maxlen=RECENT_SAMPLES)
        self._traces: dict[str, TokenTrace] = {}
        self._trace_order: list[str] = []

    def decode(self, frame: dict) -> tuple[EngineSnapshot, dict]:
        try:
            return self._decode(frame)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, BadRecording):
                raise
            raise BadRecording(f"frame: {type(exc).__name__} {exc}"[:200]) from None

    def _decode(self, frame: dict) -> tuple[EngineSnapshot, dict]:
        n = self.header["num_blocks"]
        if frame.get("key"):
            self._reset()
        self._scalars(frame)
        if "bs" in frame:
            self._bs = _unb64(frame["bs"], "<i1", n)
            if self._bs.min(initial=0) < 0 or self._bs.max(initial=0) > 2:
                raise BadRecording("block states outside 0..2")
        if "rc" in frame:
            self._rc = _unb64(frame["rc"], "<i4", n)
            if self._rc.min(initial=0) < 0:
                raise BadRecording("a negative refcount")
        self._decode_requests(frame)
        self._steps.extend(_step_from(s) for s in frame.get("steps", ()))
        self._lat.extend(tuple(x) for x in schema.check_samples(frame.get("lat", []), 3, "lat"))
        self._itl.extend(tuple(x) for x in schema.check_samples(frame.get("itl", []), 2, "itl"))
        self._events.extend(
            EngineEvent(**{**schema.check_event(e, n), "blocks": tuple(e["blocks"])})
            for e in frame.get("ev", ()))
        self._ttft_parts.extend(
            tuple(x) for x in schema.check_samples(frame.get("ttft", []), 4, "ttft"))
        self._decode_traces(frame)
        return self._snapshot(frame), self._state["workload"]

    def _decode_traces(self, frame: dict) -> None:
        for d in frame.get("tr", ()):
            trace = _trace_from(d)
            self._traces[trace.request_id] = trace
        if "tro" in frame:
            order = frame["tro"]
            if not isinstance(order, list) or not all(r in self._traces for r in order):
                raise BadRecording("frame: tro names a token trace it never sent")
            self._trace_order = order
            self._traces = {r: self._traces[r] for r in order}

    def _scalars(self, frame: dict) -> None:
        for key in ("time", "t"):
            if not schema.is_type(frame.get(key), "float"):
                raise BadRecording(f"frame: {key} is not a number")
        if not schema.is_type(frame.get("step"), "int") or not isinstance(frame.get("paused"),
                                                                          bool):
            raise BadRecording("frame: step/paused missing")
        s = self._state
        if "knobs" in frame:
            if not isinstance(frame["knobs"], dict):
                raise BadRecording("frame: knobs is not an object")
            s["knobs"] = SchedulerConfig(**frame["knobs"])     # validates itself
        if "counters" in frame:
            s["counters"] = EngineCounters(**schema.check_counters(frame["counters"]))
        for key in ("workload", "extra"):
            if key in frame:
                s[key] = schema.check_plain_dict(frame[key], key)
        if "error" in frame:
            if frame["error"] is not None and not isinstance(frame["error"], str):
                raise BadRecording("frame: error is not a string")
            s["error"] = frame["error"]
        if s["knobs"] is None or s["counters"] is None:
            raise BadRecording("frame: no knobs/counters yet (a delta without its keyframe)")

    def _snapshot(self, frame: dict) -> EngineSnapshot:
        h, s = self.header, self._state
        return EngineSnapshot(
            time=frame["time"], step=frame["step"], model=h["model"], device=h["device"],
            dtype=h["dtype"], knobs=s["knobs"], paused=frame["paused"],
            num_blocks=h["num_blocks"], block_size=h["block_size"], block_state=self._bs,
            block_refcount=self._rc, requests=tuple(self._views[r] for r in self._order),
            last_step=self._steps[-1] if self._steps else None,
            recent_steps=tuple(self._steps), counters=s["counters"],
            recent_latencies=tuple(self._lat), recent_itls=tuple(self._itl),
            error=s["error"], events=tuple(self._events),
            recent_ttft_parts=tuple(self._ttft_parts),
            traces=tuple(self._traces[r] for r in self._trace_order), **_runtime(s["extra"]))

    def _decode_requests(self, frame: dict) -> None:
        n = self.header["num_blocks"]
        if "order" in frame:
            order = frame["order"]
            if not isinstance(order, list) or not all(isinstance(r, str) for r in order):
                raise BadRecording("frame: order is not a list of ids")
            self._order = order
        for rid, d in dict(frame.get("new", {})).items():
            self._set_view(rid, schema.check_request(dict(d), n))
        for rid, delta in dict(frame.get("upd", {})).items():
            d, delta = dict(self._dicts[rid]), dict(delta)
            if "text+" in delta:
                d["text"] = (d.get("text") or "") + str(delta.pop("text+"))
            d.update(delta)
            self._set_view(rid, schema.check_request(d, n))
        missing = [r for r in self._order if r not in self._dicts]
        if missing:
            raise BadRecording(f"frame: unknown request {missing[0]!r} in the order")
        live = set(self._order)
        for rid in [r for r in self._dicts if r not in live]:
            del self._dicts[rid], self._views[rid]

    def _set_view(self, rid: str, d: dict) -> None:
        self._dicts[rid] = d
        self._views[rid] = RequestView(**{**{k: d[k] for k in _REQ_FIELDS if k in d},
                                          "blocks": tuple(d["blocks"]),
                                          "output_tail": tuple(d.get("output_tail", ())),
                                          "logprobs": _logprobs_from(d.get("logprobs"))})


def _logprobs_from(value) -> TokenLogprobs | None:
    return None if value is None else TokenLogprobs(list(value[0]), list(value[1]), value[2])


def _runtime(extra: dict) -> dict:
    """A recording's "extra" object -> EngineSnapshot's runtime fields (a value of the
    wrong type, or a name it does not have, is left out: the field keeps its default)."""
    defaults = {f.name: f.default for f in dataclasses.fields(EngineSnapshot)}
    return {k: v for k, v in extra.items() if k in RUNTIME_FIELDS
            and type(v) is type(defaults[k])}
