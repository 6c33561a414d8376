"""The engine process's KV event publisher: vLLM's ZMQ PUB stream with a replay socket
(the format: engine/kv_events.py; the events: engine/core/kv/kv_events.py).

The engine thread hands each step's raw events to `publish`, which only queues them
(never waits: a full queue drops the batch, leaving a gap in the sequence numbers that a
subscriber sees). This thread builds vLLM's structs, encodes, sends, keeps the last
`buffer_steps` payloads and answers replay requests between sends. Both sockets are
CURVE servers keyed by the engine key (engine/ipc/curve.py), so only a key holder
subscribes: the events carry prompt tokens.
"""
from __future__ import annotations

import queue
import threading
from collections import deque

import msgspec
import numpy as np
import zmq

from engine.config import KVEventsConfig
from engine.core.kv.kv_events import REMOVED, STORED
from engine.ipc import curve
from engine.kv_events import (END_SEQ, AllBlocksCleared, BlockRemoved, BlockStored,
                              KVEventBatch, seq_bytes, seq_of)

REPLAY_POLL_S = 0.02          # the longest a replay request waits while nothing is sent
# MAXMSGSIZE of what peers send: subscriptions and replay requests (a sequence number),
# and the CURVE handshake's commands before them (a few hundred bytes)
PEER_MESSAGE_BYTES = 4096
_IDLE = object()


class KVEventPublisher:
    def __init__(self, config: KVEventsConfig, endpoint: str, replay_endpoint: str | None,
                 engine_key: str, block_size: int, data_parallel_rank: int = 0):
        self.endpoint, self.replay_endpoint = endpoint, replay_endpoint
        self._topic = config.topic.encode()
        self._block_size, self._rank = block_size, data_parallel_rank
        # a SimpleQueue (C: a put is a tenth of queue.Queue's, and it runs once a step on
        # the engine thread); its bound is kept here
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._max_queue = config.max_queue_size
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._encoder = msgspec.msgpack.Encoder()
        self.dropped = 0               # batches the full queue refused
        self._ctx = zmq.Context()
        try:
            self._pub = self._bind(zmq.PUB, endpoint, engine_key, PEER_MESSAGE_BYTES,
                                   {zmq.SNDHWM: config.hwm})
            self._replay = None if replay_endpoint is None else self._bind(
                zmq.ROUTER, replay_endpoint, engine_key, PEER_MESSAGE_BYTES, {zmq.SNDHWM: 0})
        except BaseException:
            self._ctx.destroy(linger=0)
            raise
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    def _bind(self, kind: int, endpoint: str, key: str, max_bytes: int,
              options: dict) -> zmq.Socket:
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        curve.serve(sock, key, max_bytes)
        for option, value in options.items():
            sock.setsockopt(option, value)
        sock.bind(endpoint)
        return sock

    @property
    def bound(self) -> tuple[str, str | None]:
        """The endpoints as bound (a tcp port given as * resolved)."""
        last = lambda s: s.getsockopt_string(zmq.LAST_ENDPOINT)   # noqa: E731
        return last(self._pub), None if self._replay is None else last(self._replay)

    # -- the engine thread -----------------------------------------------------------
    def publish(self, seq: int, ts: float, events: list) -> None:
        """Queue one step's raw events (KVEventRecorder's sink); never waits."""
        if self._queue.qsize() < self._max_queue:
            self._queue.put((seq, ts, events))
        else:
            self.dropped += 1

    def close(self, timeout: float = 2.0) -> None:
        """Send what is queued, then stop; idempotent."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout)
        if not self._thread.is_alive():
            self._ctx.destroy(linger=0)

    # -- the publisher thread --------------------------------------------------------
    def _run(self) -> None:
        """Send every queued batch, then answer the waiting replay requests: a replay
        holds every batch queued before its request arrived (what a late subscriber,
        told the engine's latest sequence number, waits for)."""
        wait = REPLAY_POLL_S if self._replay is not None else None
        while True:
            try:
                item = self._queue.get(timeout=wait)
            except queue.Empty:
                item = _IDLE
            try:
                if item is None:
                    return
                if item is not _IDLE:
                    self._send(*item)
                if not self._drain():
                    return
                if self._replay is not None and not self._serve_replays():
                    return
            except zmq.ZMQError:
                return             # the context was destroyed under us: the process ends

    def _drain(self) -> bool:
        """Send what is queued now; False once the stop marker comes."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return True
            if item is None:
                return False
            self._send(*item)

    def _send(self, seq: int, ts: float, raw: list) -> None:
        payload = self._encoder.encode(KVEventBatch(ts, self._events(raw), self._rank))
        self._pub.send_multipart((self._topic, seq_bytes(seq), payload), copy=False)
        self._buffer.append((seq, payload))

    def _events(self, raw: list) -> list:
        """vLLM's structs of one batch's raw events (engine/core/kv/kv_events.py)."""
        tokens, bs = self._tokens(raw), self._block_size
        out, at = [], 0
        for e in raw:
            kind = e[0]
            if kind is STORED:            # [STORED, hashes, parent, keys, medium]
                n = len(e[3]) * bs
                out.append(BlockStored(e[1], e[2], tokens[at:at + n], bs, None, e[4]))
                at += n
            elif kind is REMOVED:         # [REMOVED, hashes, medium]
                out.append(BlockRemoved(e[1], e[2]))
            else:
                out.append(AllBlocksCleared())
        return out

    @staticmethod
    def _tokens(raw: list) -> list[int]:
        """The token ids of every stored block of a batch, in order: one array over all
        their keys (engine/block_hash.py block_key's layout: the parent's int64, then
        int32 tokens), not one unpack a block."""
        keys = [key for e in raw if e[0] is STORED for key in e[3]]
        if not keys:
            return []
        words = np.frombuffer(b"".join(keys), dtype="<i4").reshape(len(keys), -1)
        return words[:, 2:].astype(np.int64).ravel().tolist()   # int64: tolist's fast path

    def _serve_replays(self) -> bool:
        """Answer each waiting request [b"", start seq] with every buffered batch from
        `start` on, then the end marker. The queue is drained once a request is taken,
        so a batch queued before the request arrived is in the answer even when it came
        after the drain before this call. False once the stop marker comes."""
        while self._replay.poll(0):
            frames = self._replay.recv_multipart()
            if not self._drain():
                return False
            if len(frames) != 3 or len(frames[2]) != 8:
                continue               # not a replay request: no answer
            ident, start = frames[0], seq_of(frames[2])
            for seq, payload in list(self._buffer):
                if seq >= start:
                    self._replay.send_multipart((ident, b"", seq_bytes(seq), payload),
                                                copy=False)
            self._replay.send_multipart((ident, b"", END_SEQ, b""))
        return True
