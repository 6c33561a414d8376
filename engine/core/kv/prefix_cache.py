"""Block-granular prefix index: a hash chain over full blocks.

The key of block i is (hash of block i-1's key, tokens of block i) packed as bytes, and
its hash is hash(key), so equal keys mean equal whole prefixes. The index is a dict on
the exact key: a hash collision can never hand out the wrong KV. The index holds no
refcount of its own: a block is "cached" while it is in the index, and evictable while
it is cached and no block table holds it (the pool tracks that LRU set).

Keys are bytes, not tuples, and the two dicts hold only ints and bytes: nothing here is
tracked by the garbage collector. (As (parent, tokens) tuples, a GPU's 340k-block index
was a million tracked objects that every full collection walked, and the tuples of new
blocks, ~270 a step under load, filled the young generation.)
"""
from __future__ import annotations

import struct
from typing import Callable

ROOT_HASH = 0


_PACKERS: dict[int, Callable] = {}    # by token count: one struct.pack per key


def block_key(parent: int, tokens) -> bytes:
    """The exact index key of a full block: its parent's hash (int64) and its token ids
    (int32), little-endian. One precompiled struct per block size: half the cost of
    joining to_bytes and array().tobytes(), and a block fills every step somewhere."""
    pack = _PACKERS.get(len(tokens))
    if pack is None:
        pack = _PACKERS[len(tokens)] = struct.Struct(f"<q{len(tokens)}i").pack
    return pack(parent, *tokens)


def key_tokens(key: bytes) -> list[int]:
    """The token ids a key holds (for checks and tests)."""
    return list(struct.unpack(f"<{(len(key) - 8) // 4}i", key[8:]))


class PrefixCache:
    def __init__(self):
        self._block_of: dict[bytes, int] = {}   # key -> block
        self._key_of: dict[int, bytes] = {}     # block -> key

    def __len__(self) -> int:
        return len(self._key_of)

    def __contains__(self, block: int) -> bool:
        return block in self._key_of

    def get(self, key: bytes) -> int | None:
        return self._block_of.get(key)

    def insert(self, key: bytes, block: int) -> bool:
        """Register a full, computed block. First writer wins; returns True if added."""
        if key in self._block_of or block in self._key_of:
            return False
        self._block_of[key] = block
        self._key_of[block] = key
        return True

    def remove(self, block: int) -> bytes | None:
        """Drop the block from the index; its key (None: it was not indexed)."""
        key = self._key_of.pop(block, None)
        if key is not None:
            del self._block_of[key]
        return key

    def blocks(self) -> list[int]:
        return list(self._key_of)

    def items(self):
        """(block, key) of every indexed block."""
        return self._key_of.items()
