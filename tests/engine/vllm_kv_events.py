"""A KV event consumer written from vLLM's published schema (vllm/distributed/kv_events.py,
the version with `medium`), independent of engine/kv_events.py: msgspec array-like
structs tagged by class name, a batch [ts, events, data_parallel_rank], the frames
(topic, 8-byte big-endian sequence number, payload), and the replay protocol (a ROUTER
answering [b"", start] with [b"", seq, payload]... then seq -1). `CacheMirror` applies
the events to a block map the way a router would. The documented hash
(docs/ROUTING.md) is recomputed here from hashlib alone."""
from __future__ import annotations

import hashlib
import struct
from typing import Any

import msgspec

BlockHash = int | bytes     # vLLM's ExternalBlockHash


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[BlockHash]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


DECODER = msgspec.msgpack.Decoder(KVEventBatch)


def documented_hash(parent: int | None, tokens: list[int]) -> int:
    """docs/ROUTING.md: BLAKE2b-64 of (parent int64, tokens int32...) little-endian,
    read as a little-endian signed int64; the first block's parent is 0."""
    key = struct.pack(f"<q{len(tokens)}i", parent or 0, *tokens)
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little", signed=True)


class CacheMirror:
    """An engine's prefix caches rebuilt from its events, one map per medium ("GPU": the
    device pool, "CPU": a host tier): hash -> (parent, tokens)."""

    def __init__(self):
        self.tiers: dict[str | None, dict[BlockHash, tuple[BlockHash | None, tuple[int, ...]]]] = {}
        self.next_seq = 0
        self.ranks: set = set()
        self.media: set = set()

    @property
    def blocks(self) -> dict:
        """The device tier's blocks."""
        return self.tiers.setdefault("GPU", {})

    def apply(self, seq: int, payload: bytes) -> None:
        assert seq == self.next_seq, f"sequence {seq} after {self.next_seq - 1}"
        self.next_seq += 1
        batch = DECODER.decode(payload)
        self.ranks.add(batch.data_parallel_rank)
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                self.media.add(ev.medium)
                tier = self.tiers.setdefault(ev.medium, {})
                assert len(ev.token_ids) == len(ev.block_hashes) * ev.block_size
                parent = ev.parent_block_hash
                for i, h in enumerate(ev.block_hashes):
                    tokens = tuple(ev.token_ids[i * ev.block_size:(i + 1) * ev.block_size])
                    assert h == documented_hash(parent, list(tokens))
                    tier[h] = (parent, tokens)
                    parent = h
            elif isinstance(ev, BlockRemoved):
                self.media.add(ev.medium)
                tier = self.tiers.setdefault(ev.medium, {})
                for h in ev.block_hashes:
                    del tier[h]              # a removed block was stored before
            else:
                for tier in self.tiers.values():
                    tier.clear()
