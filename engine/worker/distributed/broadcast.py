"""Rank 0 -> every rank: one pickled message per step (a StepBatch of numpy arrays).

Two transports with one interface (`send(obj)` on rank 0, `recv()` elsewhere):
- `TorchBroadcast`: a torch.distributed broadcast on the CPU (gloo) group: size, then the
  bytes. Needs nothing but the group; a dead peer surfaces as a gloo error.
- `ShmBroadcast`: one shared-memory slot (multiprocessing.shared_memory) with a sequence
  number; readers poll it and acknowledge, the writer waits for every ack before the next
  write (vLLM's shm_broadcast, single slot). With `wakeups` (one semaphore per reader) a
  reader spins briefly, then sleeps in the kernel until the writer posts (a futex wake)
  instead of polling with sleeps. docs/TP.md has the costs per step.
Pickle protocol 5 keeps numpy arrays as raw buffers.
"""
from __future__ import annotations

import pickle
import time
from multiprocessing import shared_memory
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist


class TransportError(RuntimeError):
    """The other side of a step broadcast is gone."""


class TorchBroadcast:
    def __init__(self, group, rank: int):
        self.group, self.rank = group, rank

    def send(self, obj) -> None:
        data = pickle.dumps(obj, protocol=5)
        dist.broadcast(torch.tensor([len(data)], dtype=torch.int64), 0, group=self.group)
        dist.broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8), 0, group=self.group)

    def recv(self):
        size = torch.empty(1, dtype=torch.int64)
        dist.broadcast(size, 0, group=self.group)
        buf = torch.empty(int(size), dtype=torch.uint8)
        dist.broadcast(buf, 0, group=self.group)
        return pickle.loads(buf.numpy())

    def close(self) -> None:
        pass


class ShmBroadcast:
    """Header of uint64: [seq, size, ack(rank 1), ack(rank 2), ...], then the payload."""

    HEADER = 8 * 64   # room for 62 readers' acks
    SPIN_S = 50e-6    # with wakeups: spin this long before sleeping on the semaphore

    def __init__(self, name: str | None, num_readers: int, rank: int,
                 capacity: int = 64 << 20, alive: Callable[[], bool] = lambda: True,
                 wakeups: list | None = None):
        create = name is None
        self.shm = shared_memory.SharedMemory(name=name, create=create,
                                              size=self.HEADER + capacity if create else 0)
        self.name, self.rank, self.num_readers, self.alive = self.shm.name, rank, num_readers, alive
        self.header = np.ndarray((self.HEADER // 8,), dtype=np.uint64, buffer=self.shm.buf)
        self.capacity = self.shm.size - self.HEADER
        self.seq = int(self.header[0])
        self.wakeups = wakeups      # multiprocessing semaphores, one per reader (rank r: r-1)

    def _wait(self, ready: Callable[[], bool], what: str) -> None:
        """Spin briefly (a step is usually microseconds away), then sleep: 0.1 ms while
        steps flow, 1 ms once idle for a second (an idle engine costs no core)."""
        spins, start = 0, time.monotonic()
        last_check = start
        while not ready():
            spins += 1
            if spins < 2000:
                continue
            now = time.monotonic()
            time.sleep(0 if spins < 4000 else 1e-4 if now - start < 1.0 else 1e-3)
            if now - last_check > 0.05:
                last_check = now
                if not self.alive():
                    raise TransportError(f"step broadcast: peer gone while waiting for {what}")

    def send(self, obj) -> None:
        data = pickle.dumps(obj, protocol=5)
        if len(data) > self.capacity:
            raise TransportError(f"step message of {len(data)} bytes exceeds the shared-memory "
                                 f"slot ({self.capacity} bytes)")
        acks = self.header[2:2 + self.num_readers]
        self._wait(lambda: bool((acks == self.seq).all()), "the ranks to read the last step")
        self.shm.buf[self.HEADER:self.HEADER + len(data)] = data
        self.header[1] = len(data)
        self.seq += 1
        self.header[0] = self.seq        # published last: readers see a complete payload
        for wakeup in self.wakeups or ():
            wakeup.release()

    def _sleep_until(self, ready: Callable[[], bool], what: str) -> None:
        """Spin SPIN_S, then block on this reader's semaphore (a post per message; a post
        left over from a message the spin caught only costs one extra check)."""
        deadline = time.perf_counter() + self.SPIN_S
        while not ready():
            if time.perf_counter() < deadline:
                continue
            if not self.wakeups[self.rank - 1].acquire(timeout=0.05) and not self.alive():
                raise TransportError(f"step broadcast: peer gone while waiting for {what}")

    def recv(self):
        ready = lambda: int(self.header[0]) != self.seq   # noqa: E731
        if self.wakeups:
            self._sleep_until(ready, "the next step")
        else:
            self._wait(ready, "the next step")
        self.seq = int(self.header[0])
        size = int(self.header[1])
        obj = pickle.loads(self.shm.buf[self.HEADER:self.HEADER + size])
        self.header[1 + self.rank] = self.seq      # ack: the slot may be rewritten
        return obj

    def close(self) -> None:
        del self.header
        self.shm.close()
        if self.rank == 0:
            self.shm.unlink()
