"""The host KV tier, core side: which host block holds what, and each step's copies.

Host blocks (ids into the worker's HostKVCache, engine/worker/kv_transfer.py) are kept by
a second BlockPool, so they have the device blocks' states and rules:
  free    nothing in it
  cached  a full block's KV under its prefix key (the device index's own key), refcount
          0, evictable in the eviction_policy order (lru / lfu, as the device's)
  used    refcount >= 1: a swapped-out request's block (its SwapRecord is the one
          holder), or, within one step, a block an offload writes or a reload reads
Each step's moves are queued while the scheduler plans (`store`, `reload`, `swap_out`,
`swap_in`), sent to every rank as one KVTransfer before the step's forward, then settled:
offloaded blocks enter the host index and reloaded ones the device index only then, so a
block whose copy has not been queued is never found by a lookup. A queued copy is
ordered before every later access of the same blocks (the worker's streams): a block in
flight is readable by the first step that can look it up.

Offload on eviction, not write-through: a full cached block is copied to the host when
the device pool evicts it (reuses it for other KV), under the same prefix key. Only
blocks the device loses cross the link, the host holds what the device does not (the
tiers add up: device + host blocks of prefixes, where write-through's host would mostly
repeat the device), and the copy never waits: the step gathers the evicted blocks on the
device before its forward overwrites them, and the write to the host overlaps the
forward. Write-through would copy every block as it fills (most are never evicted) and
fill the host with the newest blocks, the ones the device still holds.
"""
from __future__ import annotations

import numpy as np

from engine.core.kv.block_pool import BlockPool
from engine.core.kv.counters import Counters
from engine.kv_events import MEDIUM_CPU
from engine.kv_metrics import HistogramAccumulator
from engine.worker.kv_transfer import KVTransfer

# vLLM's kv_offload_size buckets (bytes of one transfer)
TRANSFER_SIZE_BUCKETS = (1e6, 5e6, 10e6, 20e6, 40e6, 60e6, 80e6, 100e6, 150e6, 200e6)
_EMPTY = np.zeros(0, dtype=np.int64)


class SwapRecord:
    """A swapped-out request's KV in the host tier: its blocks (one per computed block, in
    table order) and what it had computed."""
    __slots__ = ("blocks", "num_computed_tokens", "block_hashes", "settled")

    def __init__(self, blocks: list[int], num_computed_tokens: int, block_hashes: list[int]):
        self.blocks = blocks
        self.num_computed_tokens = num_computed_tokens
        self.block_hashes = block_hashes
        self.settled = False      # its copy was sent: it may be swapped back in


class TierStep:
    """One settled step's moves (device blocks, by request), for events and StepStats."""
    __slots__ = ("offloaded", "reloads", "swap_outs", "swap_ins", "bytes_per_block")

    def __init__(self, bytes_per_block: int = 0):
        self.bytes_per_block = bytes_per_block
        self.offloaded: list[int] = []                  # evicted blocks copied out
        self.reloads: dict[str, list[int]] = {}         # prefix hits copied back in
        self.swap_outs: dict[str, tuple[int, ...]] = {}
        self.swap_ins: dict[str, list[int]] = {}

    @property
    def blocks_out(self) -> int:
        return len(self.offloaded) + sum(map(len, self.swap_outs.values()))

    @property
    def blocks_in(self) -> int:
        return sum(map(len, self.reloads.values())) + sum(map(len, self.swap_ins.values()))


class HostTier:
    def __init__(self, num_blocks: int, device: BlockPool, bytes_per_block: int,
                 counters: Counters):
        self.device = device
        self.pool = BlockPool(num_blocks, device.block_size)   # its own pool counters
        self.pool.clock = device.clock
        # the device's hash and KV event recorder: its blocks are stored and removed
        # under medium "CPU" (vLLM's offloading connector's)
        self.pool.hash_fn, self.pool.kv_events = device.hash_fn, device.kv_events
        self.pool.medium = MEDIUM_CPU
        self.num_blocks = num_blocks
        self.bytes_per_block = bytes_per_block     # every rank's shard together
        self.counters = counters
        self.caching = True      # enable_prefix_caching: offloads and lookups (follow())
        self._offload: list[tuple[int, int, bytes | None]] = []   # (device, host, key)
        self._reload: list[tuple[int, int, bytes | None, object]] = []   # (host, device,
        #                                                  key: None for a swap-in, request)
        self._swap_outs: list = []     # requests swapped out this step
        self.last = TierStep()
        self.sizes = (HistogramAccumulator(TRANSFER_SIZE_BUCKETS),   # bytes per transfer:
                      HistogramAccumulator(TRANSFER_SIZE_BUCKETS))   # out, in
        self.timer = lambda: (0.0, 0.0)   # seconds the copies took (out, in): the engine
        #                                   sets its runner's HostKVCache.copy_seconds

    def sync_times(self) -> Counters:
        """The counters, with the copies' time read now (it completes after the step that
        queued the copy: read when stats or snapshots are built)."""
        out, back = self.timer()
        c = self.counters
        c.kv_offload_us, c.kv_reload_us = int(out * 1e6), int(back * 1e6)
        return c

    def follow(self, knobs) -> None:
        """The live knobs it obeys: prefix caching (stores and lookups) and eviction."""
        self.caching = knobs.enable_prefix_caching
        self.pool.eviction_policy = knobs.eviction_policy

    def lookup(self, key: bytes) -> int | None:
        return self.pool.index.get(key) if self.caching else None

    # -- queued while the scheduler plans ----------------------------------------------------
    def store(self, blocks: list[int], keys: list[bytes]) -> None:
        """Device blocks evicted from the prefix cache: copy each to a host block under
        its key (unless the host holds that key already: then it is only refreshed)."""
        if not self.caching:
            return
        pool = self.pool
        for block, key in zip(blocks, keys):
            held = pool.index.get(key)
            if held is not None:
                if pool.refs[held] == 0:
                    pool.incref(held)      # most recently used again (lru)
                    pool.decref(held)
                continue
            fresh = pool.allocate(1)       # evicts the host's own lru (or lfu) block
            if fresh is None:              # every host block is held: the KV is dropped
                self.counters.kv_offload_dropped += 1
                continue
            self._offload.append((block, fresh[0], key))

    def hold(self, blocks: list[int]) -> None:
        """Prefix hits in the host tier, about to be reloaded: a hit each, and held (not
        evictable) until their copy is sent (settle) or the admission is undone (cancel)."""
        self.pool.touch(blocks)

    def reload(self, req, pairs: list[tuple[int, int, bytes]]) -> None:
        """Queue the reloads of held host blocks: (host block, device block, key) each."""
        self._reload.extend((h, d, key, req) for h, d, key in pairs)

    def cancel(self, req) -> None:
        """The request gave back the blocks its reloads were for (admission undone)."""
        mine = [r for r in self._reload if r[3] is req]
        if mine:
            self._reload = [r for r in self._reload if r[3] is not req]
            self.pool.release([h for h, _, _, _ in mine])

    def swap_out(self, req, blocks: list[int]) -> bool:
        """Copy a preempted request's computed blocks to new host blocks (evicting cached
        host blocks if needed); False, changing nothing, if the tier cannot take them."""
        hosts = self.pool.allocate(len(blocks))
        if hosts is None:
            return False
        self._offload.extend((d, h, None) for d, h in zip(blocks, hosts))
        req.swap = SwapRecord(hosts, req.num_computed_tokens, list(req.block_hashes))
        self._swap_outs.append((req, tuple(blocks)))
        return True

    def swap_in(self, req) -> None:
        """The request is re-admitted with fresh device blocks: copy its host blocks back
        into the first of them (the host blocks are free once the copy is sent)."""
        rec, req.swap = req.swap, None
        self._reload.extend((h, d, None, req) for h, d in zip(rec.blocks, req.block_table))

    def drop_swap(self, req) -> None:
        """A swapped-out request ended (or its copy failed): its host blocks are free."""
        rec, req.swap = req.swap, None
        if not rec.settled:                 # its copy still queued: unqueue it
            mine = set(rec.blocks)
            self._offload = [o for o in self._offload if o[1] not in mine]
            self._swap_outs = [s for s in self._swap_outs if s[0] is not req]
        self.pool.release(rec.blocks)

    # -- the step's copies -----------------------------------------------------------------
    def send(self, executor) -> TierStep | None:
        """Queue the step's copies on every rank (executor.transfer_kv) and settle them;
        None if there were none. A failed send settles them as failed and raises."""
        xfer = self.take_transfer()
        if xfer is None:
            return None
        try:
            executor.transfer_kv(xfer)
        except BaseException:
            self.settle(False)
            raise
        self.settle(True)
        return self.last

    def take_transfer(self) -> KVTransfer | None:
        """The queued copies as one KVTransfer (None: nothing to copy)."""
        if not self._offload and not self._reload:
            return None
        off, rel = self._offload, self._reload
        return KVTransfer(np.array([o[0] for o in off], np.int64) if off else _EMPTY,
                          np.array([o[1] for o in off], np.int64) if off else _EMPTY,
                          np.array([r[0] for r in rel], np.int64) if rel else _EMPTY,
                          np.array([r[1] for r in rel], np.int64) if rel else _EMPTY)

    def settle(self, sent: bool) -> None:
        """After the transfer was queued on every rank (sent) or failed: index what was
        offloaded and reloaded, let go of the holds. A failed transfer indexes nothing;
        its swapped-out requests lose their records (they recompute) and the core fails
        the step's requests (their reloaded blocks hold nothing)."""
        step, pool = TierStep(self.bytes_per_block), self.pool
        for d, h, key in self._offload:
            if key is None:
                continue                    # a swap-out's block: its record holds it
            if sent:
                pool.index_block(key, h)
                step.offloaded.append(d)
            pool.decref(h)                  # cached (indexed) or free
        swap_outs, self._swap_outs = self._swap_outs, []
        for req, blocks in swap_outs:
            if sent:
                req.swap.settled = True
                step.swap_outs[req.request_id] = blocks
            else:
                self.drop_swap(req)
        for h, d, key, req in self._reload:
            if key is None:
                if sent:
                    step.swap_ins.setdefault(req.request_id, []).append(d)
            elif sent:
                self.device.index_block(key, d)
                step.reloads.setdefault(req.request_id, []).append(d)
            pool.decref(h)                  # back to cached (a hit) or free (swap-in)
        self._offload, self._reload = [], []
        pool.take_evicted()
        self.counters.host_evictions = pool.counters.evictions
        if sent:
            self._count(step)
        self.last = step

    def _count(self, step: TierStep) -> None:
        c, size = self.counters, self.bytes_per_block
        out, back = step.blocks_out, step.blocks_in
        c.kv_offload_blocks += out
        c.kv_reload_blocks += back
        c.swap_outs += len(step.swap_outs)
        c.swap_ins += len(step.swap_ins)
        if out:
            self.sizes[0].add(out * size)
        if back:
            self.sizes[1].add(back * size)

    def clear(self) -> int:
        """Forget every cached host block (swapped-out requests keep theirs)."""
        return self.pool.clear_cache()

    def check(self, swapped: list) -> None:
        """Assert the host pool's invariants: between steps nothing is in flight, and a
        block's refcount is the number of swap records holding it."""
        assert not self._offload and not self._reload, "host tier copies left unsettled"
        self.pool.check([req.swap.blocks for req in swapped])
        for req in swapped:
            assert req.swap.settled, f"{req.request_id}: swap record never settled"
