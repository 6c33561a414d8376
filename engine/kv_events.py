"""KV cache events in vLLM's wire format (vllm/distributed/kv_events.py), the schema
that the engine's publisher encodes and a router decodes.

A message on the PUB socket is three frames: the topic, the batch's sequence number
(8 bytes, big-endian; one more per batch, a skipped number is a lost batch) and the
msgpack payload: a KVEventBatch as an array [ts, events, data_parallel_rank], each event
an array whose first item is its type's name ("BlockStored", "BlockRemoved",
"AllBlocksCleared") followed by its fields in order. The replay socket (ROUTER) answers
a request [b"", start seq (8 bytes, big-endian)] with [b"", seq, payload] for every
batch it still holds from `start` on, then [b"", -1 (8 bytes, signed), b""].

Block hashes are engine/block_hash.py's stable_block_hash chain; `medium` names the
tier that holds the blocks: "GPU" is the engine's KV pool (whatever its device), "CPU"
a host-memory tier. lora_id is always None (no LoRA here).
"""
from __future__ import annotations

import msgspec

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
END_SEQ = (-1).to_bytes(8, "big", signed=True)      # the end of a replay


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """One change to an engine's prefix cache (tagged by its class name)."""


class BlockStored(KVCacheEvent):
    """Full blocks entered the prefix cache: one chain, each block's parent the one
    before it (the first's is parent_block_hash, None at the prompt's start);
    token_ids: all of their tokens, block_size a block."""
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(KVCacheEvent):
    """Blocks left the prefix cache (evicted)."""
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    """The whole prefix cache was cleared."""


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One engine step's events, in the order they happened."""
    ts: float                    # time.time() when the step ended
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


batch_decoder = msgspec.msgpack.Decoder(KVEventBatch)


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big", signed=True)


def seq_of(frame: bytes) -> int:
    return int.from_bytes(frame, "big", signed=True)
