"""Checks for recordings read back from disk: a recording is untrusted data.

Every value that the replay puts into a snapshot is checked here against the snapshot
dataclasses' own field types (engine/snapshot.py), so a damaged or hand-edited file
is refused line by line with a `BadRecording` message instead of a traceback, and
nothing odd (a string refcount, a block index past the pool) reaches the panels.
"""
from __future__ import annotations

import dataclasses
import json
import math

import numpy as np

from engine.config import MAX_SPECULATIVE_TOKENS
from engine.outputs import TokenTrace
from engine.snapshot import ChunkInfo, EngineCounters, EngineEvent, RequestView, StepStats

MAX_LINE_CHARS = 64 << 20        # one JSON line (a keyframe of a very large pool fits)
MAX_NUM_BLOCKS = 10_000_000


class BadRecording(ValueError):
    """A recording line that cannot be replayed (the message says which part)."""


def _reject_constant(name: str):
    raise BadRecording(f"non-finite number {name}")


def parse_line(line: str) -> dict:
    """One JSON object per line; NaN/Infinity and oversized lines are refused."""
    if len(line) > MAX_LINE_CHARS:
        raise BadRecording(f"a line of {len(line)} characters (limit {MAX_LINE_CHARS})")
    try:
        obj = json.loads(line, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise BadRecording(f"not JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise BadRecording("a line that is not a JSON object")
    return obj


def is_type(value, typ: str) -> bool:
    if typ == "None":
        return value is None
    if typ == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if typ == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and \
            math.isfinite(value)
    if typ == "str":
        return isinstance(value, str)
    if typ == "bool":
        return isinstance(value, bool)
    if typ.startswith("tuple[int"):
        return isinstance(value, list) and all(is_type(v, "int") for v in value)
    return True     # nested types are checked by their own checker


def check_fields(cls, d, what: str, skip: tuple[str, ...] = ()) -> dict:
    """`d` has every field of dataclass `cls`, each of its declared type."""
    if not isinstance(d, dict):
        raise BadRecording(f"{what}: expected an object")
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        if f.name not in d:
            raise BadRecording(f"{what}: missing {f.name}")
        if not any(is_type(d[f.name], t.strip()) for t in str(f.type).split("|")):
            raise BadRecording(f"{what}: {f.name} is not {f.type}: {str(d[f.name])[:40]!r}")
    return d


def check_blocks(blocks, num_blocks: int, what: str) -> None:
    if any(b < 0 or b >= num_blocks for b in blocks):
        raise BadRecording(f"{what}: a block index outside the pool of {num_blocks}")


def check_header(h: dict) -> dict:
    for key in ("model", "device", "dtype"):
        if not isinstance(h.get(key), str):
            raise BadRecording(f"header: {key} must be a string")
    for key, top in (("num_blocks", MAX_NUM_BLOCKS), ("block_size", 1 << 20)):
        v = h.get(key)
        if not is_type(v, "int") or not 1 <= v <= top:
            raise BadRecording(f"header: {key} must be an integer in 1..{top}")
    return h


# newer than format 1: may be absent
LATER_REQUEST_FIELDS = ("output_tail", "priority", "spec_draft_tokens", "spec_accepted_tokens",
                        "logprobs", "scheduled_ts", "last_chunk_ts", "prefill_chunks",
                        "prefill_preemptions", "host_cached_tokens", "swapped",
                        "grammar")      # never recorded: a replay shows no grammar mask


def check_request(d, num_blocks: int) -> dict:
    check_fields(RequestView, d, "request", skip=LATER_REQUEST_FIELDS)
    if "output_tail" in d and not is_type(d["output_tail"], "tuple[int"):
        raise BadRecording("request: output_tail is not a list of token ids")
    for name in ("priority", "spec_draft_tokens", "spec_accepted_tokens", "prefill_chunks",
                 "prefill_preemptions", "host_cached_tokens"):
        if name in d and not is_type(d[name], "int"):
            raise BadRecording(f"request: {name} is not an int")
    for name in ("scheduled_ts", "last_chunk_ts"):
        if d.get(name) is not None and not is_type(d[name], "float"):
            raise BadRecording(f"request: {name} is not a number")
    if "swapped" in d and type(d["swapped"]) is not bool:
        raise BadRecording("request: swapped is not true or false")
    lp = d.get("logprobs")
    if lp is not None and not (isinstance(lp, list) and len(lp) == 3
                               and is_type(lp[0], "tuple[int") and isinstance(lp[1], list)
                               and all(isinstance(v, (int, float)) for v in lp[1])
                               and is_type(lp[2], "int")):
        raise BadRecording("request: logprobs is not [token_ids, logprobs, rank]")
    check_blocks(d["blocks"], num_blocks, f"request {d['request_id']}")
    return d


# step fields added after format 1 was written: older recordings read them as 0 ("")
LATER_STEP_FIELDS = {"spec_verified": 0, "spec_draft_tokens": 0, "spec_accepted_tokens": 0,
                     "budget": 0, "mode": "", "blocks_to_host": 0, "blocks_from_host": 0,
                     "bytes_to_host": 0, "bytes_from_host": 0, "spec_off": 0,
                     "spec_drafted_per_pos": (), "spec_accepted_per_pos": ()}


def check_step(d) -> dict:
    check_fields(StepStats, d, "step", skip=tuple(LATER_STEP_FIELDS))
    for name, default in LATER_STEP_FIELDS.items():
        v = d.setdefault(name, default)
        if isinstance(default, tuple):      # a JSON list of counts
            if not (isinstance(v, (list, tuple)) and len(v) <= MAX_SPECULATIVE_TOKENS
                    and all(is_type(x, "int") and x >= 0 for x in v)):
                raise BadRecording(f"step: {name} is not a list of counts")
            d[name] = tuple(v)
        elif type(v) is not type(default):
            raise BadRecording(f"step: {name} is not {type(default).__name__}")
    chunks = d["prefill_chunks"]
    if not isinstance(chunks, list):
        raise BadRecording("step: prefill_chunks must be a list")
    for c in chunks:
        if not isinstance(c, list) or len(c) != 4:
            raise BadRecording("step: a prefill chunk is not [id, start, tokens, total]")
        check_fields(ChunkInfo, dict(zip(("request_id", "start", "num_tokens", "total"), c)),
                     "prefill chunk")
    return d


def check_trace(d) -> dict:
    """A token trace's scalars (its arrays: check_trace_arrays once decoded)."""
    if not isinstance(d, dict) or not isinstance(d.get("request_id"), str):
        raise BadRecording("token trace: expected an object with a request_id")
    for name, top in (("num_tokens", 1 << 24), ("top", 1024)):
        if not is_type(d.get(name), "int") or not 0 <= d[name] <= top:
            raise BadRecording(f"token trace: {name} must be an integer in 0..{top}")
    return d


def check_trace_arrays(t: TokenTrace) -> None:
    """Array sizes that agree with each other, origins that exist, no NaN."""
    n = len(t)
    logprob_bytes = (12 * t.top + 4) * n
    if len(t.token_ids) != 4 * n or len(t.times) != 8 * n or n > t.num_tokens or \
            len(t.logprobs) not in (0, logprob_bytes) or \
            len(t.raw_logprobs) not in (0, logprob_bytes) or (t.raw_logprobs and not t.logprobs):
        raise BadRecording("token trace: array sizes that do not agree")
    codes, drafts = t.origins()
    if (drafts > MAX_SPECULATIVE_TOKENS).any() or ((codes == 0) & (drafts > 0)).any():
        raise BadRecording("token trace: an origin that does not exist")
    if not np.isfinite(t.token_times()).all() or (t.ids() < 0).any():
        raise BadRecording("token trace: a time or token id out of range")
    for data in (t.logprobs, t.raw_logprobs):
        if data and np.isnan(np.frombuffer(data, "<f8", n * t.top, 4 * n * t.top)).any():
            raise BadRecording("token trace: a NaN logprob")


def check_event(d, num_blocks: int) -> dict:
    check_fields(EngineEvent, d, "engine event")
    check_blocks(d["blocks"], num_blocks, "engine event")
    return d


# counters added after format 1 was written: older recordings read them as 0
LATER_COUNTERS = ("device_wait_us", "snapshot_build_us", "gc_pause_us", "spec_decode_num_drafts",
                  "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens",
                  "grammar_compiles", "grammar_steps", "grammar_rows", "grammar_fill_us",
                  "kv_offload_blocks", "kv_reload_blocks", "kv_offload_dropped", "host_evictions",
                  "host_prefix_hit_tokens", "swap_outs", "swap_ins", "swap_fallbacks",
                  "kv_offload_us", "kv_reload_us", "spec_decode_steps_with_drafts",
                  "spec_decode_steps_without_drafts", "spec_decode_steps_off")


def check_counters(d) -> dict:
    check_fields(EngineCounters, d, "counters", skip=LATER_COUNTERS)
    for name in LATER_COUNTERS:
        if not is_type(d.setdefault(name, 0), "int"):
            raise BadRecording(f"counters: {name} is not int")
    return d


def check_samples(rows, width: int, what: str) -> list:
    """(time, value[, value-or-None]) rows of finite numbers."""
    if not isinstance(rows, list):
        raise BadRecording(f"{what}: expected a list")
    for row in rows:
        if not isinstance(row, list) or len(row) != width or not all(
                is_type(v, "float") or (i == 2 and v is None) for i, v in enumerate(row)):
            raise BadRecording(f"{what}: a malformed sample")
    return rows


WORKLOAD_TYPES = {"scenario": ("str",), "concurrency": ("int", "None"),
                  "rate": ("float", "None"), "submitted": ("int",), "in_flight": ("int",),
                  "failed": ("int",), "refused": ("int",), "last_error": ("str", "None")}


def check_plain_dict(d, what: str) -> dict:
    """workload / extra: an object of scalars; known workload keys of their type."""
    if not isinstance(d, dict) or not all(
            isinstance(k, str) and (v is None or isinstance(v, (str, int, float, bool)))
            for k, v in d.items()):
        raise BadRecording(f"{what}: expected an object of plain values")
    for key, types in WORKLOAD_TYPES.items():
        if what == "workload" and key in d and not any(is_type(d[key], t) for t in types):
            raise BadRecording(f"workload: {key} has the wrong type")
    return d


MAX_PIECE_CHARS = 256      # one token's text


def check_pieces(d) -> dict[int, str]:
    """A frame's token pieces ({str(id): text}) as {id: text}."""
    if not isinstance(d, dict):
        raise BadRecording("frame: pieces is not an object")
    out = {}
    for key, text in d.items():
        if not (isinstance(key, str) and key.isdigit() and int(key) < 1 << 31
                and isinstance(text, str) and len(text) <= MAX_PIECE_CHARS):
            raise BadRecording("frame: a token piece that is not id -> short text")
        out[int(key)] = text
    return out
