"""The data-parallel router: which replica serves a request (docs/ROUTING.md).

Pure decisions: the data-parallel front (engine/front/dp_client.py) gives each call the
prompt's token ids and every replica's load, and the router answers with a
RouteDecision that keeps what it weighed (the routing card shows it). Policies, live:

- round_robin: the next live replica in turn.
- least_load: vLLM's data-parallel balancer: the least 4 x waiting + running.
- consistent_hash: the prompt's first block (the first block_size tokens, or the whole
  prompt if shorter) on a ring of VIRTUAL_NODES points per replica: one prefix always
  lands on one replica, and a dead replica's share moves to its ring neighbours only.
  Blind to load: under skew it pins a hot prefix to one saturated replica.
- cache_aware: the least cost  w x (P - C_r) + A_r : P the prompt's full blocks, C_r the
  longest prefix of them replica r holds (its KV events), A_r the KV blocks in use there
  (its stats, plus the prompts routed to it since), w = kv_overlap_score_weight (one
  block to prefill against one block of load; Dynamo's cost). Ties: least_load, then
  the lowest rank.
- cache_first: SGLang's cache_aware rule. While the replicas' loads (vLLM's score) are
  within BALANCE_THRESHOLD of each other, the replica holding the longest cached prefix
  if it holds at least CACHE_SHARE of the prompt, else the one whose index holds the
  fewest blocks (a new prefix goes where there is room); past the threshold, the least
  loaded. The cache decides while the loads allow it, where cache_aware trades the two
  on every request.

A request may pin a replica (data_parallel_rank): honoured while that replica lives.
"""
from __future__ import annotations

import bisect
import itertools
import threading
from collections import deque
from dataclasses import dataclass

from engine.block_hash import ROOT_HASH, block_key, prompt_block_hashes, stable_block_hash
from engine.config import ROUTING_POLICIES, InvalidRequestError

VIRTUAL_NODES = 64        # ring points per replica (consistent_hash)
RECENT_DECISIONS = 256    # kept for the routing card
# cache_first: loads within this many points of vLLM's score (4 x waiting + running) are
# even (SGLang's balance_abs_threshold is 32 running requests; 8 held the skewed and the
# uniform workloads on the CPU, docs/ROUTING.md "cache_first"), and a cached prefix of at
# least this share of the prompt decides (SGLang's cache_threshold)
BALANCE_THRESHOLD = 8
CACHE_SHARE = 0.5


@dataclass(frozen=True)
class ReplicaLoad:
    waiting: int            # queued in the engine, plus sent since its last stats
    running: int
    active_blocks: int      # KV blocks in use, plus the prompts sent since
    alive: bool = True

    @property
    def score(self) -> int:
        """vLLM's data-parallel load score."""
        return 4 * self.waiting + self.running


@dataclass(frozen=True)
class RouteDecision:
    request_id: str
    policy: str
    chosen: int
    reason: str
    prompt_blocks: int                  # P: the prompt's full blocks
    cached_blocks: tuple[int, ...]      # C_r per replica (cache_aware; else ())
    loads: tuple[ReplicaLoad, ...]
    costs: tuple[float, ...]            # each replica's figure under the policy (inf: dead)


class NoReplica(RuntimeError):
    """Every replica is gone."""


class Router:
    def __init__(self, size: int, block_size: int, policy: str = "least_load",
                 kv_overlap_score_weight: float = 1.0, caches=None):
        """caches: per replica, an object with prefix_blocks(chain) -> int (the front's
        KV index, engine/front/kv_index.py); needed by cache_aware only."""
        self.size, self.block_size = size, block_size
        self.weight = float(kv_overlap_score_weight)
        self.caches = caches
        self.policy = policy
        self._turn = itertools.count()
        self._ring = sorted((stable_block_hash(f"replica-{r}-{v}".encode()), r)
                            for r in range(size) for v in range(VIRTUAL_NODES))
        self._ring_keys = [h for h, _ in self._ring]
        self.recent: deque[RouteDecision] = deque(maxlen=RECENT_DECISIONS)
        self.routed = [0] * size            # requests sent to each replica
        self._lock = threading.Lock()

    @property
    def policy(self) -> str:
        return self._policy

    @policy.setter
    def policy(self, name: str) -> None:
        if name not in ROUTING_POLICIES:
            raise InvalidRequestError(f"routing_policy must be one of "
                                      f"{', '.join(ROUTING_POLICIES)}, got {name!r:.60}")
        self._policy = name

    def choose(self, request_id: str, token_ids, loads: list[ReplicaLoad],
               pinned: int | None = None) -> RouteDecision:
        """The replica for one request (NoReplica if none lives)."""
        live = [r for r, load in enumerate(loads) if load.alive]
        if not live:
            raise NoReplica("every engine replica is gone")
        policy, blocks = self._policy, len(token_ids) // self.block_size
        cached, costs = (), tuple(float(load.score) if load.alive else float("inf")
                                  for load in loads)
        if pinned is not None and loads[pinned].alive:
            chosen, reason = pinned, f"pinned to replica {pinned} by the request"
        elif policy == "round_robin":
            chosen = self._round_robin(live)
            reason = "its turn"
        elif policy == "least_load":
            chosen = min(live, key=lambda r: (costs[r], r))
            reason = f"least 4 x waiting + running ({costs[chosen]:g})"
        elif policy == "consistent_hash":
            chosen = self._on_ring(token_ids, live)
            reason = "the ring's owner of the prompt's first block"
        elif policy == "cache_first":
            cached = self._cached(token_ids)
            chosen, reason = self._cache_first(cached, blocks, loads, live)
        else:
            cached, costs = self._cache_costs(token_ids, blocks, loads)
            chosen = min(live, key=lambda r: (costs[r], loads[r].score, r))
            reason = (f"least w x uncached + active blocks ({costs[chosen]:g}: "
                      f"{cached[chosen]}/{blocks} blocks cached there)")
        decision = RouteDecision(request_id, policy, chosen, reason, blocks, cached,
                                 tuple(loads), costs)
        with self._lock:
            self.routed[chosen] += 1
            self.recent.append(decision)
        return decision

    def _round_robin(self, live: list[int]) -> int:
        while True:
            r = next(self._turn) % self.size
            if r in live:
                return r

    def _on_ring(self, token_ids, live: list[int]) -> int:
        head = list(token_ids[:self.block_size])
        key = stable_block_hash(block_key(ROOT_HASH, head))
        i = bisect.bisect_left(self._ring_keys, key)
        for j in range(len(self._ring)):
            r = self._ring[(i + j) % len(self._ring)][1]
            if r in live:
                return r
        raise NoReplica("every engine replica is gone")

    def _cached(self, token_ids) -> tuple[int, ...]:
        """C_r: the prompt's leading full blocks each replica's index holds."""
        chain = prompt_block_hashes(token_ids, self.block_size)
        return tuple(self.caches[r].prefix_blocks(chain) if self.caches else 0
                     for r in range(self.size))

    def _cache_first(self, cached, blocks: int, loads: list[ReplicaLoad], live: list[int]
                     ) -> tuple[int, str]:
        spread = max(loads[r].score for r in live) - min(loads[r].score for r in live)
        if spread > BALANCE_THRESHOLD:
            chosen = min(live, key=lambda r: (loads[r].score, r))
            return chosen, (f"loads {spread} apart (> {BALANCE_THRESHOLD}): the least 4 x "
                            f"waiting + running ({loads[chosen].score})")
        best = max(live, key=lambda r: (cached[r], -loads[r].score, -r))
        if blocks and cached[best] >= CACHE_SHARE * blocks:
            return best, (f"loads within {BALANCE_THRESHOLD}: the longest cached prefix "
                          f"({cached[best]}/{blocks} blocks)")
        held = [self.caches[r].held_blocks() if self.caches else 0 for r in range(self.size)]
        chosen = min(live, key=lambda r: (held[r], loads[r].score, r))
        return chosen, (f"no replica holds half the prompt: the one caching the fewest "
                        f"blocks ({held[chosen]})")

    def _cache_costs(self, token_ids, blocks: int, loads: list[ReplicaLoad]
                     ) -> tuple[tuple[int, ...], tuple[float, ...]]:
        cached = self._cached(token_ids)
        costs = tuple(self.weight * (blocks - c) + load.active_blocks if load.alive
                      else float("inf") for c, load in zip(cached, loads))
        return cached, costs
