"""The pool of KV blocks: free list, refcounts, the evictable cached blocks.

Every block is in exactly one state:
  free    refcount 0, not in the prefix index      (in `_free`)
  used    refcount >= 1 (refcount = block tables holding it; the index holds none)
  cached  refcount 0, in the prefix index           (in `_cached`, release order)
Allocation takes free blocks first, then evicts cached ones in the order of the
`eviction_policy` knob: lru, the least recently released; lfu, the fewest prefix hits
since allocation, then the least recently released (a heap, kept only under lfu).
With a host tier (kv_offloading_size) every evicted block is handed to `offload` with its
prefix key, before the allocation returns it (engine/core/kv/host_tier.py).
"""
from __future__ import annotations

import heapq
import time
from array import array
from collections import OrderedDict, deque
from typing import Callable

import numpy as np

from engine.block_hash import ROOT_HASH, key_parent
from engine.kv_events import MEDIUM_GPU
from engine.codes import BLOCK_CACHED, BLOCK_USED
from engine.core.kv.block_metrics import BlockLifetimes
from engine.core.kv.kv_events import KVEventRecorder
from engine.core.kv.prefix_cache import PrefixCache
from engine.core.kv.counters import Counters


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, counters: Counters | None = None):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.counters = counters if counters is not None else Counters()
        # the refcounts: an array.array (`refs`) for the per-block reads and writes, which
        # give Python ints (numpy's scalar indexing costs ~3x more, and a wide decode step
        # reads one per request), seen as numpy (`refcounts`, no copy) for the whole-pool
        # operations and checks
        self.refs = array("i", bytes(4 * num_blocks))
        self.refcounts = np.frombuffer(self.refs, dtype=np.int32)
        self._free: deque[int] = deque(range(num_blocks))
        self._cached: OrderedDict[int, int] = OrderedDict()   # block -> release number
        # the same set as a mask, kept in step: states() must not walk a cache that can
        # hold every block of the pool (O(cached) per snapshot slowed a full pool's engine)
        self._cached_mask = np.zeros(num_blocks, dtype=bool)
        self._released = 0
        self._lfu: list[tuple[int, int, int]] | None = None   # (hits, release no., block)
        self.index = PrefixCache()
        self._evicted: list[int] = []     # evicted since the last take_evicted()
        self.clock = time.perf_counter    # the engine sets its serving clock
        self.lifetimes = BlockLifetimes(num_blocks)
        self.hash_fn: Callable[[bytes], int] = hash   # a full block's key -> its hash
        # each indexed block's hash, kept when it is indexed: an eviction's event and a
        # prefix lookup read it instead of hashing the key again
        self.block_hash: list[int] = [0] * num_blocks
        self.kv_events: KVEventRecorder | None = None  # set with kv_events_config on
        self.medium = MEDIUM_GPU     # the tier its events name (the host tier's: "CPU")
        self.offload = None     # (evicted blocks, their keys) -> None: the host tier's store

    # -- the eviction policy ---------------------------------------------------
    @property
    def eviction_policy(self) -> str:
        return "lru" if self._lfu is None else "lfu"

    @eviction_policy.setter
    def eviction_policy(self, name: str) -> None:
        if name == self.eviction_policy:
            return
        if name == "lru":
            self._lfu = None
        else:
            hits = self.lifetimes.num_hits
            self._lfu = [(int(hits[b]), seq, b) for b, seq in self._cached.items()]
            heapq.heapify(self._lfu)

    def _pop_evictable(self) -> int:
        """The cached block the policy evicts next (lfu: skip stale heap entries)."""
        if self._lfu is None:
            block = self._cached.popitem(last=False)[0]
            self._cached_mask[block] = False
            return block
        while True:
            _, seq, block = heapq.heappop(self._lfu)
            if self._cached.get(block) == seq:
                del self._cached[block]
                self._cached_mask[block] = False
                return block

    def _make_cached(self, blocks: list[int]) -> None:
        """The blocks (refcount 0, indexed) become evictable, in this release order."""
        first = self._released + 1
        self._released += len(blocks)
        cached = self._cached
        for block, seq in zip(blocks, range(first, first + len(blocks))):
            cached[block] = seq     # (OrderedDict.update of pairs costs ~1.7x this loop)
        self._cached_mask[blocks] = True
        if self._lfu is not None:
            hits = self.lifetimes.num_hits
            for seq, block in enumerate(blocks, first):
                heapq.heappush(self._lfu, (int(hits[block]), seq, block))
            if len(self._lfu) > 2 * len(self._cached) + 64:     # drop stale entries
                self._lfu = [e for e in self._lfu if self._cached.get(e[2]) == e[1]]
                heapq.heapify(self._lfu)

    # -- queries -------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    @property
    def num_available(self) -> int:
        """Blocks an allocation can get: free plus evictable cached."""
        return len(self._free) + len(self._cached)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_available

    def states(self) -> np.ndarray:
        """Per-block state codes (engine.codes BLOCK_*) as a fresh int8 array."""
        st = (self.refcounts > 0).astype(np.int8) * np.int8(BLOCK_USED)
        st[self._cached_mask] = BLOCK_CACHED
        return st

    def take_evicted(self) -> list[int]:
        """Blocks evicted from the prefix cache since the last call."""
        out, self._evicted = self._evicted, []
        return out

    def record_lookup(self, queried_tokens: int, hit_tokens: int) -> None:
        c = self.counters
        c.prefix_lookups += 1
        c.prefix_hits += hit_tokens > 0
        c.prefix_queried_tokens += queried_tokens
        c.prefix_hit_tokens += hit_tokens

    # -- mutations -----------------------------------------------------------
    def allocate(self, n: int) -> list[int] | None:
        """n fresh blocks with refcount 1, or None (and no change) if not enough."""
        if n > self.num_available:
            return None
        out, evicted, keys, refs = [], [], [], self.refs
        for _ in range(n):
            if self._free:
                block = self._free.popleft()
            else:
                block = self._pop_evictable()
                keys.append(self.index.remove(block))
                evicted.append(block)
            refs[block] = 1
            out.append(block)
        now = self.clock()
        if evicted:
            if self.kv_events is not None:
                bh = self.block_hash
                self.kv_events.removed([bh[b] for b in evicted], self.medium)
            if self.offload is not None:
                self.offload(evicted, keys)
            self.counters.evictions += len(evicted)
            self._evicted.extend(evicted)
            self.lifetimes.on_evicted(evicted, now)
        self.lifetimes.on_allocated(out, now)
        return out

    def index_block(self, key: bytes, block: int) -> None:
        """A block whose KV arrived from elsewhere (a host tier reload, a host tier's
        offload) enters the prefix index under its key, with a stored event when KV
        events are on (the key holds its parent's hash); a key already indexed leaves the
        block out, as registration does."""
        if self.index.insert(key, block):
            h = self.block_hash[block] = self.hash_fn(key)
            if self.kv_events is not None:
                parent = key_parent(key)
                self.kv_events.stored(h, None if parent == ROOT_HASH else parent, key,
                                      self.medium)

    def incref(self, block: int) -> None:
        refs = self.refs
        if refs[block] == 0:
            self._cached.pop(block)    # a hit on a cached block: it is no longer evictable
            self._cached_mask[block] = False
        refs[block] += 1

    def touch(self, blocks: list[int]) -> None:
        """Prefix-cache hits: a reference each, and a hit on each block's record (vLLM's
        BlockPool.touch; the hits feed lfu and the residency metrics)."""
        now = self.clock()
        for block in blocks:
            self.incref(block)
            self.lifetimes.on_hit(block, now)

    def decref(self, block: int) -> None:
        self.release((block,))

    def release(self, blocks) -> None:
        """Drop one reference to each block; tail blocks first so they are evicted first."""
        self.release_tables((blocks,))

    def release_tables(self, tables) -> None:
        """release() of each table in turn, in one pass, the cached blocks of all of them
        made evictable together: a finishing request's ~40 blocks were most of its host
        cost, one decref call each, and W1's finishing steps end 16 requests each."""
        refs, indexed, free, cached = self.refs, self.index.key_of, self._free, []
        for blocks in tables:
            for block in reversed(blocks):
                rc = refs[block] - 1
                if rc <= 0:
                    assert rc == 0, f"block {block} refcount underflow"
                    (cached if block in indexed else free).append(block)
                refs[block] = rc
        if cached:
            self._make_cached(cached)

    def clear_cache(self) -> int:
        """Forget every cached prefix; cached-unreferenced blocks become free."""
        n = len(self._cached)
        indexed = self.index.blocks()
        for block in indexed:
            self.index.remove(block)
        self._free.extend(self._cached)
        self._cached.clear()
        self._cached_mask[:] = False
        if self._lfu is not None:
            self._lfu = []
        if self.kv_events is not None:
            if self.medium == MEDIUM_GPU:
                self.kv_events.cleared()
            else:    # a host tier alone: AllBlocksCleared would clear the device's too
                bh = self.block_hash
                self.kv_events.removed([bh[b] for b in indexed], self.medium)
        return n

    # -- checks --------------------------------------------------------------
    def check(self, tables: list[list[int]]) -> None:
        """Assert the invariants of DESIGN.md against the given block tables."""
        expected = np.zeros(self.num_blocks, dtype=np.int32)
        for table in tables:
            for b in table:
                expected[b] += 1
        bad = np.nonzero(expected != self.refcounts)[0]
        assert bad.size == 0, f"refcount mismatch at blocks {bad[:8].tolist()}"
        free, cached = set(self._free), set(self._cached)
        assert len(free) == len(self._free), "duplicate block in free list"
        assert not free & cached, "block both free and cached"
        zero = set(np.nonzero(self.refcounts == 0)[0].tolist())
        assert zero == free | cached, "a block with refcount 0 is neither free nor cached"
        assert all(b in self.index for b in cached), "cached block missing from index"
        assert not any(b in self.index for b in free), "free block still indexed"
        assert set(np.nonzero(self._cached_mask)[0].tolist()) == cached, "cached mask out of step"
