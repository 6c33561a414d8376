"""Block-granular prefix index: a hash chain over full blocks.

The key of block i is (hash of block i-1's key, tokens of block i) packed as bytes, and
its hash is the pool's hash_fn(key) (engine/block_hash.py), so equal keys mean equal
whole prefixes. The index is a dict on
the exact key: a hash collision can never hand out the wrong KV. The index holds no
refcount of its own: a block is "cached" while it is in the index, and evictable while
it is cached and no block table holds it (the pool tracks that LRU set).

Keys are bytes, not tuples, and the two dicts hold only ints and bytes: nothing here is
tracked by the garbage collector. (As (parent, tokens) tuples, a GPU's 340k-block index
was a million tracked objects that every full collection walked, and the tuples of new
blocks, ~270 a step under load, filled the young generation.)
"""
from __future__ import annotations

from engine.block_hash import ROOT_HASH, block_key, key_tokens  # noqa: F401  (re-exported)


class PrefixCache:
    def __init__(self):
        self._block_of: dict[bytes, int] = {}   # key -> block
        # block -> key; read-only outside: `block in key_of` is the membership test
        # of a loop over many blocks (no method call per block)
        self.key_of: dict[int, bytes] = {}

    def __len__(self) -> int:
        return len(self.key_of)

    def __contains__(self, block: int) -> bool:
        return block in self.key_of

    def get(self, key: bytes) -> int | None:
        return self._block_of.get(key)

    def insert(self, key: bytes, block: int) -> bool:
        """Register a full, computed block. First writer wins; returns True if added."""
        if key in self._block_of or block in self.key_of:
            return False
        self._block_of[key] = block
        self.key_of[block] = key
        return True

    def remove(self, block: int) -> bytes | None:
        """Drop the block from the index; returns its key (None: it was not indexed)."""
        key = self.key_of.pop(block, None)
        if key is not None:
            del self._block_of[key]
        return key

    def blocks(self) -> list[int]:
        return list(self.key_of)

    def items(self):
        """(block, key) of every indexed block."""
        return self.key_of.items()
