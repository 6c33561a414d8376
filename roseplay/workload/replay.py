"""Read a recording back (for `--replay`): checked line by line, decoded on demand.

`Recording(path)` reads the file once. Each line is untrusted data: it is parsed and
decoded by a checking FrameDecoder (roseplay/workload/record_schema.py); a bad line is skipped
up to the next keyframe and noted, and a cut-off file (a killed session) replays
what was written, with `end_note` saying where and why it ends. Only the encoded
frames are kept, and compressed: each keyframe's group (the keyframe and the deltas up
to the next one) is one zlib block, so memory holds about the file's size, not the
JSON's (~10x more). `rec[i]` decompresses one group and decodes frame i from its
keyframe (sequential play continues from the last decoded frame), caching a few frames.
"""
from __future__ import annotations

import bisect
import zlib
from collections import OrderedDict
from dataclasses import dataclass

from roseplay.workload.frames import FrameDecoder, ReplayFrame
from roseplay.workload.record import MAX_RECORDING_BYTES, READABLE_VERSIONS, iter_lines
from roseplay.workload.record_replicas import ReplicaDecoder
from roseplay.workload.record_schema import (BadRecording, check_pieces, check_plain_dict,
                                             parse_line)

CACHED_FRAMES = 16
MAX_NOTES = 5


@dataclass(frozen=True)
class FrameEntry:
    t: float
    step: int
    group: int                  # the compressed block that holds its line
    offset: int                 # its line's index in that block
    key: bool                   # decodable from a clean decoder (starts a group)
    events: tuple[dict, ...]    # user actions recorded before this frame


class Recording:
    """A recording's header and frames; `rec[i]` is a ReplayFrame (decoded when asked)."""

    def __init__(self, path: str, max_bytes: int = MAX_RECORDING_BYTES):
        with open(path, "rb"):         # a missing/unreadable file: the OSError as it is
            pass
        self.path, self.max_bytes = path, max_bytes
        self.entries: list[FrameEntry] = []
        self._groups: list[bytes] = []          # zlib blocks of "\n"-joined frame lines
        self._open: list[str] = []              # lines of the group being read
        self._group_cache: tuple[int, list[str]] = (-1, [])
        self.pieces: dict[int, str] = {}    # token id -> its text (frames' `pieces`)
        self.notes: list[str] = []      # bad lines skipped (the first few)
        self.skipped = 0
        self.end_note: str | None = None
        self._read()
        self._keys = [i for i, e in enumerate(self.entries) if e.key]
        self._times = [e.t for e in self.entries]
        self._decoder: FrameDecoder | None = None
        self._dp_decoder: ReplicaDecoder | None = None
        self._decoded = -1
        self._cache: OrderedDict[int, ReplayFrame] = OrderedDict()

    # -- reading the file --------------------------------------------------------------
    def _read(self) -> None:
        lines = iter_lines(self.path)
        first, why = next(lines, (None, "the file is empty"))
        try:
            self.header = parse_line(first) if first is not None else {}
        except BadRecording:
            self.header = {}
        if self.header.get("kind") != "header":
            why = f": {why}" if why else ""
            raise ValueError(f"not a roseplay recording (no header line{why})")
        if self.header.get("version") not in READABLE_VERSIONS:
            raise ValueError(f"recording format {self.header.get('version')!r} is not supported")
        checker = FrameDecoder(self.header)     # BadRecording (a ValueError) if the header is bad
        self._scan(lines, checker, self._replica_decoder())
        self._close_group()
        if not self.entries:
            raise ValueError("the recording holds no readable frame"
                             + (f" ({self.end_note})" if self.end_note else ""))

    def _scan(self, lines, checker: FrameDecoder, dp_checker: ReplicaDecoder | None) -> None:
        pending, resync, total = [], False, 0
        for number, (line, why) in enumerate(lines, start=2):
            if why:
                self.end_note = why
                return
            total += len(line)
            if total > self.max_bytes:
                self.end_note = f"only the first {self.max_bytes >> 20} MB are replayed"
                return
            if not line.strip():
                continue
            try:
                obj = parse_line(line)
                if obj.get("kind") == "event":
                    pending.append(self._event(obj))
                    continue
                if obj.get("kind") != "frame":
                    raise BadRecording(f"unknown line kind {str(obj.get('kind'))[:20]!r}")
                first = not self.entries
                if resync and not obj.get("key"):
                    self.skipped += 1
                    continue
                pieces = check_pieces(obj.get("pieces", {}))
                checker.decode(obj)
                if dp_checker is not None:
                    dp_checker.decode(obj.get("dp"))
            except BadRecording as exc:
                self._note(f"line {number}: {exc}")
                resync = True
                continue
            resync = False
            key = bool(obj.get("key")) or first
            if key:
                self._close_group()
            self.entries.append(FrameEntry(obj["t"], obj["step"], len(self._groups),
                                           len(self._open), key, tuple(pending)))
            self._open.append(line.rstrip("\n"))
            self.pieces.update(pieces)
            pending = []

    def _replica_decoder(self) -> ReplicaDecoder | None:
        """A data-parallel recording's replicas (None: one engine, or a recording from
        before 2026-11-29, whose replay shows the replicas' pools merged)."""
        return ReplicaDecoder(self.header) if "replica_blocks" in self.header else None

    def _close_group(self) -> None:
        if self._open:
            self._groups.append(zlib.compress("\n".join(self._open).encode("utf-8"), 1))
            self._open = []

    def _line(self, entry: FrameEntry) -> str:
        group, lines = self._group_cache
        if group != entry.group:
            lines = zlib.decompress(self._groups[entry.group]).decode("utf-8").split("\n")
            self._group_cache = (entry.group, lines)
        return lines[entry.offset]

    @staticmethod
    def _event(obj: dict) -> dict:
        check_plain_dict(obj, "event")
        if not isinstance(obj.get("what"), str) or not isinstance(obj.get("t"), (int, float)):
            raise BadRecording("event: needs a number t and a string what")
        return obj

    def _note(self, text: str) -> None:
        self.skipped += 1
        if len(self.notes) < MAX_NOTES:
            self.notes.append(text)

    # -- frames --------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, i: int) -> ReplayFrame:
        if i < 0:
            i += len(self.entries)
        if not 0 <= i < len(self.entries):
            raise IndexError(i)
        frame = self._cache.get(i)
        if frame is None:
            frame = self._cache[i] = self._decode(i)
            if len(self._cache) > CACHED_FRAMES:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(i)
        return frame

    def _decode(self, i: int) -> ReplayFrame:
        start = self._keys[bisect.bisect_right(self._keys, i) - 1]
        if self._decoder is None or not start <= self._decoded < i:
            self._decoder, self._decoded = FrameDecoder(self.header), start - 1
            self._dp_decoder = self._replica_decoder()
        snap = workload = front = None
        for j in range(self._decoded + 1, i + 1):
            obj = parse_line(self._line(self.entries[j]))
            snap, workload = self._decoder.decode(obj)
            if self._dp_decoder is not None:
                front = self._dp_decoder.decode(obj.get("dp"))
        self._decoded = i
        e = self.entries[i]
        return ReplayFrame(e.t, snap, workload, e.events, front)

    def index_at(self, t: float) -> int:
        """The last frame at or before recording time t (0 if t is before the first)."""
        return max(0, bisect.bisect_right(self._times, t) - 1)

    def describe_end(self) -> str | None:
        """One line for the user when the recording is not whole (None if it is)."""
        parts = []
        if self.end_note:
            last = self.entries[-1]
            parts.append(f"{self.end_note}: replay ends at {last.t:.1f} s "
                         f"(frame {len(self.entries)}, step {last.step})")
        if self.skipped:
            parts.append(f"{self.skipped} damaged line(s) skipped ({self.notes[0]})"
                         if self.notes else f"{self.skipped} frame(s) skipped")
        return "; ".join(parts) or None


def load_recording(path: str) -> Recording:
    return Recording(path)
