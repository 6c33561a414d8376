"""What each replica's prefix cache holds, rebuilt from its KV events (engine/kv_events.py):
the router's cache_aware policy reads it.

One thread subscribes to every replica's event stream (SUB, CURVE with the engine key)
and applies each batch in sequence order. A gap (a batch this subscriber missed: it
joined late, or the publisher dropped one) is filled from the replica's replay socket;
what the replay no longer holds is lost, so the replica's index starts over empty and
fills again from what it stores next (a router that under-counts a replica's cache
only routes less to it).
"""
from __future__ import annotations

import logging
import threading
import time

import msgspec
import zmq

from engine.ipc import curve
from engine.kv_events import (MEDIUM_CPU, BlockRemoved, BlockStored, batch_decoder, seq_bytes,
                              seq_of)

logger = logging.getLogger(__name__)
REPLAY_TIMEOUT_S = 2.0
# a batch the stats announce may still wait in the publisher's queue (not sent, so not in
# its replay buffer): it counts as lost only when this long passed without it
LOST_AFTER_S = 5.0


class ReplicaCache:
    """One replica's cached block hashes: its device pool's (medium "GPU") and its host
    tier's ("CPU")."""

    def __init__(self):
        self.hashes: set[int] = set()  # the device tier
        self.host: set[int] = set()    # the host tier (kv_offloading_size)
        self.seq = -1                  # the last batch applied
        self.lost = 0                  # batches neither the stream nor replay gave us

    def prefix_blocks(self, chain: list[int]) -> int:
        """How many of the chain's leading blocks this replica holds in either tier: the
        engine's lookup goes on through the host tier where the device's ends, and a
        block found there is copied back, not prefilled (docs/ROUTING.md "The index")."""
        hashes, host, n = self.hashes, self.host, 0
        for h in chain:
            if h not in hashes and h not in host:
                break
            n += 1
        return n

    def held_blocks(self) -> int:
        """Blocks this replica caches, in both tiers (cache_first sends a new prefix to
        the replica holding the fewest)."""
        return len(self.hashes) + len(self.host)

    def clear(self) -> None:
        self.hashes.clear()
        self.host.clear()

    def apply(self, payload: bytes) -> None:
        batch = batch_decoder.decode(payload)
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                self._tier(ev.medium).update(ev.block_hashes)
            elif isinstance(ev, BlockRemoved):
                self._tier(ev.medium).difference_update(ev.block_hashes)
            else:
                self.clear()

    def _tier(self, medium: str | None) -> set[int]:
        return self.host if medium == MEDIUM_CPU else self.hashes


class KVIndexFeed:
    """Subscribes to replicas' events; `caches[r]` is replica r's index."""

    def __init__(self, endpoints: list[tuple[str, str | None]], keys: list[str],
                 topics: list[str]):
        """Per replica: endpoints (events, replay or None), the engine key its sockets
        are keyed by, its events' topic."""
        self.caches = [ReplicaCache() for _ in endpoints]
        self._ctx = zmq.Context()
        self._keys = keys
        self._replay_eps = [replay for _, replay in endpoints]
        self._subs = []
        for rank, ((events, _), topic) in enumerate(zip(endpoints, topics)):
            sock = self._socket(zmq.SUB, events, rank)
            sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
            self._subs.append(sock)
        self._wanted = [-1] * len(endpoints)    # batches a waiter knows were published
        self._wanted_at = [0.0] * len(endpoints)
        self._stop = threading.Event()
        self._applied = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="roseplay-kv-index", daemon=True)
        self._thread.start()

    def _socket(self, kind: int, endpoint: str, rank: int) -> zmq.Socket:
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        curve.attach(sock, self._keys[rank])
        sock.connect(endpoint)
        return sock

    def wait_for(self, rank: int, seq: int, timeout: float) -> bool:
        """Until replica `rank`'s index applied batch `seq` (False on timeout); a batch
        published before this subscriber joined comes from the replay socket."""
        cache = self.caches[rank]
        if cache.seq < seq and seq > self._wanted[rank]:
            self._wanted_at[rank] = time.monotonic()
            self._wanted[rank] = seq
        with self._applied:
            return self._applied.wait_for(lambda: cache.seq >= seq or self._stop.is_set(),
                                          timeout)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        if not self._thread.is_alive():
            self._ctx.destroy(linger=0)

    # -- the thread --------------------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        for sock in self._subs:
            poller.register(sock, zmq.POLLIN)
        while not self._stop.is_set():
            try:
                ready = dict(poller.poll(100))
            except zmq.ZMQError:
                return
            for rank, sock in enumerate(self._subs):
                if sock in ready:
                    self._drain(rank, sock)
                if self._wanted[rank] > self.caches[rank].seq:     # nothing came live
                    self._catch_up(rank, self._wanted[rank])

    def _drain(self, rank: int, sock: zmq.Socket) -> None:
        while True:
            try:
                _, seq, payload = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            except ValueError:
                continue               # not an event message
            self._take(rank, seq_of(seq), payload)

    def _take(self, rank: int, seq: int, payload: bytes) -> None:
        cache = self.caches[rank]
        if seq <= cache.seq:
            return                     # replayed already
        if seq > cache.seq + 1:
            self._replay(rank, cache.seq + 1, seq)
        if seq == cache.seq + 1:
            self._apply(cache, seq, payload)
        else:                          # the gap stayed: what the index held is unknown
            cache.lost += seq - cache.seq - 1
            cache.clear()
            self._apply(cache, seq, payload)

    def _catch_up(self, rank: int, target: int) -> None:
        """Replay up to batch `target`; what the replay still lacks after LOST_AFTER_S
        is lost (the replay buffer moved past it, or there is no replay socket)."""
        cache = self.caches[rank]
        self._replay(rank, cache.seq + 1, target + 1)
        if cache.seq < target and time.monotonic() - self._wanted_at[rank] > LOST_AFTER_S:
            cache.lost += target - cache.seq
            cache.clear()
            with self._applied:
                cache.seq = target
                self._applied.notify_all()

    def _apply(self, cache: ReplicaCache, seq: int, payload: bytes) -> None:
        try:
            cache.apply(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            logger.warning("undecodable KV event batch %d: %s", seq, exc)
        with self._applied:
            cache.seq = seq
            self._applied.notify_all()

    def _replay(self, rank: int, start: int, until: int) -> None:
        """Apply the replica's buffered batches from `start` up to `until` - 1."""
        endpoint = self._replay_eps[rank]
        if endpoint is None:
            return
        cache, sock = self.caches[rank], self._socket(zmq.DEALER, endpoint, rank)
        try:
            sock.send_multipart([b"", seq_bytes(start)])
            deadline = time.monotonic() + REPLAY_TIMEOUT_S
            while sock.poll(max(1, int((deadline - time.monotonic()) * 1000))):
                _, seq, payload = sock.recv_multipart()
                seq = seq_of(seq)
                if seq == -1:
                    return
                if cache.seq + 1 == seq < until:
                    self._apply(cache, seq, payload)
        finally:
            sock.close(0)
