"""Block-granular prefix index: a hash chain over full blocks.

The hash of block i is hash((hash of block i-1, tokens of block i)), so equal hashes
mean equal whole prefixes. Each entry also keeps its exact key and lookups compare it,
so a hash collision can never hand out the wrong KV. The index holds no refcount of
its own: a block is "cached" while it is in the index, and evictable while it is
cached and no block table holds it (the pool tracks that LRU set).
"""
from __future__ import annotations

ROOT_HASH = 0


def chain_hash(parent: int, tokens: tuple[int, ...]) -> int:
    return hash((parent, tokens))


class PrefixCache:
    def __init__(self):
        self._by_hash: dict[int, tuple[int, tuple]] = {}   # hash -> (block, key)
        self._hash_of: dict[int, int] = {}                 # block -> hash

    def __len__(self) -> int:
        return len(self._hash_of)

    def __contains__(self, block: int) -> bool:
        return block in self._hash_of

    def get(self, h: int, key: tuple) -> int | None:
        entry = self._by_hash.get(h)
        if entry is None or entry[1] != key:
            return None
        return entry[0]

    def insert(self, h: int, key: tuple, block: int) -> bool:
        """Register a full, computed block. First writer wins; returns True if added."""
        if h in self._by_hash or block in self._hash_of:
            return False
        self._by_hash[h] = (block, key)
        self._hash_of[block] = h
        return True

    def remove(self, block: int) -> None:
        h = self._hash_of.pop(block, None)
        if h is not None:
            del self._by_hash[h]

    def blocks(self) -> list[int]:
        return list(self._hash_of)
