"""Request-level KV bookkeeping on top of the block pool.

Prefix lookup on admission (in the device pool, then the host tier), slot reservation
with copy-on-write of a shared partly filled block, registration of newly full blocks in
the prefix index, swap-out and swap-in through the host tier, and release.
"""
from __future__ import annotations

from engine.core.kv.block_pool import BlockPool
from engine.core.kv.block_tables import BlockTables
from engine.core.kv.host_tier import HostTier
from engine.block_hash import ROOT_HASH, block_key
from engine.request import Request


class KVManager:
    def __init__(self, pool: BlockPool, host: HostTier | None = None):
        self.pool = pool
        self.block_size = pool.block_size
        self.tables = BlockTables()      # every change to a block_table is mirrored here
        self.host = host                 # the host tier (kv_offloading_size), or None
        if host is not None:
            pool.offload = host.store

    def _block_key(self, req: Request, i: int, parent: int) -> bytes:
        bs = self.block_size
        return block_key(parent, req.token_slice(i * bs, (i + 1) * bs))

    # -- admission -------------------------------------------------------------
    def lookup_prefix(self, req: Request) -> int:
        """Attach cached full blocks matching the request's tokens; return hit blocks.

        At most (num_tokens - 1) // block_size blocks are reused, so at least the last
        token is recomputed and yields the logits for the next sample. A block found only
        in the host tier gets a fresh device block and a reload into it (queued for this
        step's transfer); when the device pool has no room for those, the hits end
        before the first of them.
        """
        assert not req.block_table
        hits = self._match(req)
        reloads = [i for i, (block, _, _) in enumerate(hits) if block < 0]
        if reloads and not self._room_for(hits, len(reloads)):
            del hits[reloads[0]:]
            reloads = []
        self.pool.touch([block for block, _, _ in hits if block >= 0])
        if reloads:    # held before the device allocates: its evictions go to the host
            self.host.hold([-1 - hits[i][0] for i in reloads])
        pairs = []     # (host block, device block, key) of each reload
        for i, d in zip(reloads, self.pool.allocate(len(reloads)) if reloads else ()):
            block, h, key = hits[i]
            pairs.append((-1 - block, d, key))
            hits[i] = (d, h, key)
        req.block_table.extend(block for block, _, _ in hits)
        req.block_hashes.extend(h for _, h, _ in hits)
        if hits:
            self.tables.sync(req)
        if pairs:
            self.host.reload(req, pairs)
        req.num_computed_tokens = len(hits) * self.block_size
        req.num_host_cached_tokens = len(reloads) * self.block_size
        self.pool.record_lookup(req.num_tokens, req.num_computed_tokens)
        self.pool.counters.host_prefix_hit_tokens += req.num_host_cached_tokens
        return len(hits)

    def _room_for(self, hits: list, reloads: int) -> bool:
        """Can the device pool give `reloads` blocks once the device hits are held?"""
        held = sum(1 for block, _, _ in hits if block >= 0 and self.pool.refs[block] == 0)
        return self.pool.num_available - held >= reloads

    def _match(self, req: Request) -> list[tuple[int, int, bytes]]:
        """(block, hash, key) of the cached full blocks that match the request's tokens,
        in order: a device block, or -1 - a host block where only the host tier has it."""
        max_hits = (req.num_tokens - 1) // self.block_size
        index, host = self.pool.index, self.host
        parent, hits = ROOT_HASH, []
        for i in range(max_hits):
            key = self._block_key(req, i, parent)
            block = index.get(key)
            if block is None:
                h = host.lookup(key) if host is not None else None
                if h is None:
                    break
                block = -1 - h
            parent = self.pool.block_hash[block] if block >= 0 else host.pool.block_hash[h]
            hits.append((block, parent, key))
        return hits

    def cached_prefix_blocks(self, req: Request) -> int:
        """How many blocks lookup_prefix would reuse now (no change: SGLang's lpm order)."""
        return len(self._match(req))

    def attach_shared(self, req: Request, source: Request) -> None:
        """Share every block of `source` (same-prompt dedup): refcount +1 each."""
        for block in source.block_table:
            self.pool.incref(block)
        req.block_table = list(source.block_table)
        self.tables.sync(req)
        req.block_hashes = list(source.block_hashes)
        req.num_computed_tokens = source.num_computed_tokens

    # -- per step ----------------------------------------------------------------
    def blocks_needed(self, req: Request, num_new: int) -> int:
        bs = self.block_size
        total = -(-(req.num_computed_tokens + num_new) // bs)
        return max(0, total - len(req.block_table)) + int(self._needs_cow(req))

    def _needs_cow(self, req: Request) -> bool:
        i = req.num_computed_tokens // self.block_size
        return i < len(req.block_table) and self.pool.refs[req.block_table[i]] > 1

    def reserve(self, req: Request, num_new: int, copies: list[tuple[int, int, str]]) -> bool:
        """Make room for tokens [computed, computed+num_new). On a shared partly filled
        block, swap in a private copy and queue (src, dst) in `copies` (the runner does
        all copies of a step in one batched op). Returns False, changing nothing, if the
        pool cannot supply the blocks."""
        table, computed, bs = req.block_table, req.num_computed_tokens, self.block_size
        if computed // bs < len(table) and -(-(computed + num_new) // bs) <= len(table) \
                and self.pool.refs[table[computed // bs]] == 1:
            return True    # the slots lie in blocks the request owns alone (most verifies)
        need = self.blocks_needed(req, num_new)
        if need == 0:
            return True
        fresh = self.pool.allocate(need)
        if fresh is None:
            return False
        start = len(req.block_table)
        if self._needs_cow(req):
            i = start = req.num_computed_tokens // self.block_size
            src, dst = req.block_table[i], fresh.pop()
            copies.append((src, dst, req.request_id))
            self.pool.decref(src)          # still >= 1: another table holds it
            self.pool.counters.cow_copies += 1
            req.block_table[i] = dst
        req.block_table.extend(fresh)
        self.tables.sync(req, start)
        return True

    def reserve_one(self, req: Request, copies: list[tuple[int, int, str]]) -> bool:
        """reserve(req, 1, copies) with fast paths for the two decode cases: the slot lies
        in a block the request already owns alone, or in the next block (one fresh
        block, nothing shared to copy: every `block_size` tokens of every decode)."""
        i = req.num_computed_tokens // self.block_size
        table = req.block_table
        if i < len(table):
            if self.pool.refs[table[i]] == 1:
                return True
        elif i == len(table):
            fresh = self.pool.allocate(1)
            if fresh is None:
                return False
            table.append(fresh[0])
            self.tables.sync(req, i)
            return True
        return self.reserve(req, 1, copies)

    def register_full_blocks(self, req: Request, enabled: bool) -> None:
        """Hash blocks that became full and computed; index them when caching is on (with
        KV events on, the ones indexed now are recorded once, as chains)."""
        n_full = req.num_computed_tokens // self.block_size
        start = len(req.block_hashes)
        if n_full <= start:
            return
        parent = req.block_hashes[-1] if start else ROOT_HASH
        pool = self.pool
        hash_fn, hashes, table, chain = pool.hash_fn, pool.block_hash, req.block_table, \
            req.block_hashes
        indexed: list | None = [] if pool.kv_events is not None else None
        for i in range(start, n_full):
            key = self._block_key(req, i, parent)
            parent = hash_fn(key)
            chain.append(parent)
            if enabled and pool.index.insert(key, table[i]):
                hashes[table[i]] = parent
                if indexed is not None:
                    indexed.append((i, key))
        if indexed:
            self._record_stored(chain, indexed)

    def _record_stored(self, chain: list[int], indexed: list[tuple[int, bytes]]) -> None:
        """One stored event per run of consecutive blocks indexed (a block already
        indexed under its key, a duplicate, breaks the run)."""
        record, medium = self.pool.kv_events.stored_chain, self.pool.medium
        first = 0
        for n in range(1, len(indexed) + 1):
            if n == len(indexed) or indexed[n][0] != indexed[n - 1][0] + 1:
                i0 = indexed[first][0]
                record(chain[i0:indexed[n - 1][0] + 1], chain[i0 - 1] if i0 else None,
                       [key for _, key in indexed[first:n]], medium)
                first = n

    def truncate(self, req: Request) -> list[int]:
        """Drop (and return) the blocks past the computed tokens (speculative decoding:
        the rejected drafts' slots); a dropped block was reserved for them alone, never
        hashed."""
        keep = -(-req.num_computed_tokens // self.block_size)
        if keep >= len(req.block_table):
            return []      # every reserved slot's block holds a computed token
        extra = req.block_table[keep:]
        if extra:
            del req.block_table[keep:]
            self.pool.release(extra)
            self.tables.sync(req, keep)
        return extra

    # -- swap preemption through the host tier ---------------------------------------------
    def swap_out(self, req: Request) -> bool:
        """Queue the copy of the request's computed blocks to the host tier (it is freed
        right after, as a recompute preemption is); False if there is no tier or it has
        no room (the request then recomputes)."""
        n = -(-req.num_computed_tokens // self.block_size)
        return self.host is not None and n > 0 and self.host.swap_out(req, req.block_table[:n])

    def restore_swapped(self, req: Request) -> None:
        """Re-admission of a swapped-out request: what it had computed (reserve then takes
        fresh blocks for all of it, and swap_in copies it back into them)."""
        rec = req.swap
        req.num_computed_tokens = rec.num_computed_tokens
        req.block_hashes = list(rec.block_hashes)

    def drop_all(self, reqs) -> None:
        """These requests end: their blocks in both tiers are freed, the device blocks in
        one pass (the pool's states and orders as after freeing each request's in turn;
        the host tier's are released request by request, in its own pool)."""
        host = self.host
        if host is not None:
            for req in reqs:
                host.cancel(req)          # reloads queued for blocks it gives back
                if req.swap is not None:
                    host.drop_swap(req)
        self.pool.release_tables([req.block_table for req in reqs])
        for req in reqs:
            self._forget_blocks(req)

    def free(self, req: Request) -> None:
        if self.host is not None:
            self.host.cancel(req)         # reloads queued for blocks it gives back
        self.pool.release(req.block_table)
        self._forget_blocks(req)

    def _forget_blocks(self, req: Request) -> None:
        """The request's table is released: it holds no block and has computed nothing."""
        self.tables.release(req)
        req.block_table = []
        req.block_hashes = []
        req.num_computed_tokens = 0
