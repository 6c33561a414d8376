"""The key and the hash of a full KV block, shared by the core's prefix index and a
router that matches prompts against what each engine's KV events say it holds.

A full block's key is its parent block's hash (int64) and its token ids (int32 each),
packed little-endian: `block_key(parent, tokens)`. Its hash names the whole prefix up to
and including it (the parent's hash is in the key); the first block's parent is
ROOT_HASH (0). Two hash functions, chosen once per engine:

- `hash` (Python's, SipHash of the key bytes): the default. Cheapest, but seeded per
  process (PYTHONHASHSEED), so two processes give the same block different hashes.
- `stable_block_hash`: the first 8 bytes of BLAKE2b (digest size 8, no key, no salt) of
  the key, read as a little-endian signed int64. The same in every process, run and
  language, so it is what KV events publish (docs/ROUTING.md "The hash"): a consumer
  computes a prompt's chain itself with `prompt_block_hashes`. The engine uses it when
  `kv_events_config` enables events (about 1 us a block more than `hash`).
"""
from __future__ import annotations

import hashlib
import struct
from typing import Callable, Sequence

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
    """The token ids a key holds."""
    return list(struct.unpack(f"<{(len(key) - 8) // 4}i", key[8:]))


def key_parent(key: bytes) -> int:
    """The parent block's hash a key holds (ROOT_HASH for a first block)."""
    return struct.unpack_from("<q", key)[0]


def stable_block_hash(key: bytes, _blake=hashlib.blake2b,
                      _int64=struct.Struct("<q").unpack) -> int:
    """BLAKE2b-64 of the key as a signed int64: the same everywhere (see the module).
    The digest is read with a precompiled struct: a fifth cheaper than int.from_bytes."""
    return _int64(_blake(key, digest_size=8).digest())[0]


def prompt_block_hashes(token_ids: Sequence[int], block_size: int,
                        hash_fn: Callable[[bytes], int] = stable_block_hash,
                        limit: int | None = None) -> list[int]:
    """The hash chain of a prompt's full blocks (at most `limit`), as the engine
    computes it when the blocks are filled."""
    n = len(token_ids) // block_size
    if limit is not None:
        n = min(n, limit)
    parent, out = ROOT_HASH, []
    for i in range(n):
        parent = hash_fn(block_key(parent, token_ids[i * block_size:(i + 1) * block_size]))
        out.append(parent)
    return out
