"""The engine process's output thread: it sends what the core and the input thread queue
(step outputs, replies, stats) to their clients, publishes the newest snapshot under
the key's topic, and sends every client the engine's heartbeat. Encoding and socket work
never run inside a step. The heartbeat comes from this thread, not the core's: a step
longer than client_timeout (a long prefill chunk of a big model on a CPU) is no death."""
from __future__ import annotations

import queue
import threading
import time
from typing import Callable

import zmq

from engine.ipc import protocol as P
from engine.ipc.liveness import ENGINE_HEARTBEAT_INTERVAL

PUBLISH_EVERY = 0.01     # seconds: the most often subscriptions are read and a snapshot sent


class CoreOutput:
    def __init__(self, core, out_sock: zmq.Socket, pub_sock: zmq.Socket, topic: bytes,
                 members: Callable[[], tuple[bytes, ...]], wait: float):
        """members(): the attached clients (a message queued for None goes to each);
        wait: the longest the thread sleeps on an empty queue."""
        self.core, self.out_sock, self.pub_sock = core, out_sock, pub_sock
        self._topic, self._members, self._wait = topic, members, wait
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._latest_snapshot = None
        self._snap_buf = bytearray(topic) + bytearray(1 << 20)
        self._subscribers = 0

    def put(self, client: bytes | None, msg) -> None:
        """Queue `msg` for `client` (None: every attached client). Any thread."""
        self._queue.put((client, msg))

    def on_snapshot(self, snap) -> None:
        if self._subscribers:
            self._latest_snapshot = snap      # only the newest is sent

    def run(self, stop: threading.Event) -> None:
        """Send queued messages as they come; between them (at most every
        PUBLISH_EVERY s) take subscription changes and publish the newest snapshot.
        Once `stop` is set, what is still queued goes out, then the thread ends."""
        last_pub = last_beat = 0.0
        while not stop.is_set():
            self._send_next(self._wait)
            now = time.monotonic()
            if now - last_pub >= PUBLISH_EVERY:
                last_pub = now
                self._publish_latest()
            if now - last_beat >= ENGINE_HEARTBEAT_INTERVAL:
                last_beat = now
                self.put(None, P.Heartbeat())
        while self._send_next(None):
            pass

    def _send_next(self, wait: float | None) -> bool:
        """Send the next queued message (wait: seconds to wait for one; None: none);
        False if there was none."""
        try:
            client, msg = self._queue.get(timeout=wait) if wait else self._queue.get_nowait()
        except queue.Empty:
            return False
        try:
            if client is None:           # to every client (stats)
                data = P.encoder.encode(msg)
                for c in self._members():
                    self.out_sock.send_multipart([c, data], copy=False)
            else:
                self.out_sock.send_multipart([client, P.encoder.encode(msg)], copy=False)
        except zmq.ZMQError:
            pass
        return True

    def _publish_latest(self) -> None:
        self._track_subscribers()
        snap, self._latest_snapshot = self._latest_snapshot, None
        if snap is not None:
            # into one reused buffer: a growing buffer re-copies a 1-2 MB snapshot several
            # times, and this thread holds the GIL the engine thread needs meanwhile
            t0, cpu = time.perf_counter(), time.thread_time()
            frame = P.snapshot_frame(snap)
            P.encoder.encode_into(frame, self._snap_buf, len(self._topic))   # topic first
            try:
                self.pub_sock.send(self._snap_buf, zmq.NOBLOCK, copy=True)
            except zmq.Again:
                pass          # nobody keeps up: drop the frame, never wait
            self.core.publish_cost = time.thread_time() - cpu     # CPU time, as the core
            self.core.engine.counters.snapshot_build_us += int((time.perf_counter() - t0) * 1e6)

    def _track_subscribers(self) -> None:
        """(Un)subscriptions, read only when the socket has one (no exception per call)."""
        while self.pub_sock.poll(0, zmq.POLLIN):
            event = self.pub_sock.recv(zmq.NOBLOCK)
            if event[1:] != self._topic:
                continue        # not the key's topic (e.g. ""): never applied
            if event[:1] == b"\x01":
                self.pub_sock.setsockopt(zmq.SUBSCRIBE, self._topic)
                self._subscribers += 1
            elif event[:1] == b"\x00":
                self.pub_sock.setsockopt(zmq.UNSUBSCRIBE, self._topic)
                self._subscribers = max(0, self._subscribers - 1)
        self.core.publish_snapshots = self._subscribers > 0
