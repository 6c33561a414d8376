"""The router's policies alone (engine/front/router.py): no engine, no process."""
import pytest

from engine.block_hash import prompt_block_hashes
from engine.config import InvalidRequestError
from engine.front.kv_index import ReplicaCache
from engine.front.router import NoReplica, ReplicaLoad, Router

BS = 4
IDLE = ReplicaLoad(0, 0, 0)
DEAD = ReplicaLoad(0, 0, 0, alive=False)


def caches_holding(*prompts_per_replica):
    caches = []
    for prompts in prompts_per_replica:
        c = ReplicaCache()
        for p in prompts:
            c.hashes.update(prompt_block_hashes(p, BS))
        caches.append(c)
    return caches


def test_round_robin_takes_turns_and_skips_the_dead():
    r = Router(3, BS, "round_robin")
    assert [r.choose(f"a{i}", [1], [IDLE] * 3).chosen for i in range(4)] == [0, 1, 2, 0]
    assert [r.choose(f"b{i}", [1], [IDLE, DEAD, IDLE]).chosen for i in range(4)] == [2, 0, 2, 0]
    assert r.routed == [4, 1, 3]
    with pytest.raises(NoReplica):
        r.choose("c", [1], [DEAD] * 3)


def test_least_load_is_vllms_score():
    r = Router(3, BS, "least_load")
    loads = [ReplicaLoad(1, 0, 0), ReplicaLoad(0, 3, 0), ReplicaLoad(0, 5, 0)]   # 4, 3, 5
    d = r.choose("a", [1, 2], loads)
    assert d.chosen == 1 and d.costs == (4.0, 3.0, 5.0)
    assert r.choose("b", [1], [ReplicaLoad(0, 9, 0), DEAD, ReplicaLoad(2, 0, 0)]).chosen == 2


def test_consistent_hash_keeps_a_prefix_on_one_replica_and_moves_only_the_dead_ones():
    r = Router(4, BS, "consistent_hash")
    prompts = [[i, i + 1, i + 2, i + 3, 99] for i in range(200)]
    home = [r.choose("x", p, [IDLE] * 4).chosen for p in prompts]
    assert home == [r.choose("y", p + [7, 7], [IDLE] * 4).chosen for p in prompts]  # same head
    assert len(set(home)) == 4                                   # spread over the ring
    loads = [IDLE, IDLE, DEAD, IDLE]
    moved = [r.choose("z", p, loads).chosen for p in prompts]
    assert all(m == h for m, h in zip(moved, home) if h != 2) and 2 not in moved


def test_cache_aware_trades_the_cached_prefix_against_load():
    shared = list(range(1, 33))                         # 8 blocks
    caches = caches_holding([shared], [])
    r = Router(2, BS, "cache_aware", kv_overlap_score_weight=1.0, caches=caches)
    prompt = shared + [50, 51, 52, 53]                  # 9 blocks, 8 cached on replica 0
    d = r.choose("a", prompt, [ReplicaLoad(0, 2, 6), IDLE])
    assert d.cached_blocks == (8, 0) and d.costs == (1 + 6, 9) and d.chosen == 0
    d = r.choose("b", prompt, [ReplicaLoad(0, 4, 12), IDLE])     # 1 + 12 > 9: too busy
    assert d.chosen == 1
    heavy = Router(2, BS, "cache_aware", kv_overlap_score_weight=2.0, caches=caches)
    assert heavy.choose("c", prompt, [ReplicaLoad(0, 4, 12), IDLE]).chosen == 0   # 2+12 < 18
    assert r.choose("d", [9] * 40, [IDLE, IDLE]).chosen == 0    # a tie: the lowest rank


def test_a_pin_wins_while_its_replica_lives_and_policies_switch_live():
    r = Router(2, BS, "least_load")
    assert r.choose("a", [1], [IDLE, ReplicaLoad(9, 9, 9)], pinned=1).chosen == 1
    assert r.choose("b", [1], [IDLE, DEAD], pinned=1).chosen == 0
    r.policy = "round_robin"
    assert r.recent[-1].policy == "least_load" and r.policy == "round_robin"
    with pytest.raises(InvalidRequestError, match="routing_policy"):
        r.policy = "random"


def test_replica_cache_counts_the_leading_blocks_only():
    c = caches_holding([list(range(1, 17))])[0]
    chain = prompt_block_hashes(list(range(1, 17)) + [0] * 4, BS)
    assert c.prefix_blocks(chain) == 4
    c.hashes.discard(chain[1])
    assert c.prefix_blocks(chain) == 1


def test_replica_cache_follows_both_tiers_and_counts_a_host_hit():
    """BlockStored/BlockRemoved with medium "CPU" change the host tier's set only; a
    prefix goes on through the host tier where the device's ends (the engine reloads
    those blocks instead of prefilling them), and AllBlocksCleared empties both."""
    import msgspec

    from engine.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

    chain = prompt_block_hashes(list(range(1, 17)), BS)
    enc = msgspec.msgpack.Encoder()

    def batch(*events):
        return enc.encode(KVEventBatch(0.0, list(events), 0))

    c = ReplicaCache()
    c.apply(batch(BlockStored(chain[:2], None, list(range(1, 9)), BS, None, "GPU"),
                  BlockStored(chain[2:], chain[1], list(range(9, 17)), BS, None, "CPU")))
    assert c.hashes == set(chain[:2]) and c.host == set(chain[2:])
    assert c.prefix_blocks(chain) == 4
    c.apply(batch(BlockRemoved(chain[3:], "CPU"), BlockRemoved(chain[:1], "GPU")))
    assert c.host == {chain[2]} and c.prefix_blocks(chain) == 0
    c.apply(batch(BlockStored(chain[:1], None, list(range(1, 5)), BS, None, "CPU")))
    assert c.prefix_blocks(chain) == 3          # host, device, host
    c.apply(batch(AllBlocksCleared()))
    assert not c.hashes and not c.host


def test_cache_first_follows_the_cache_while_the_loads_are_even():
    """SGLang's rule: the longest cached prefix (half the prompt or more) while the loads
    are within BALANCE_THRESHOLD, even against a higher load; past it, the least load;
    a prompt no replica holds half of goes to the replica caching the fewest blocks."""
    from engine.front.router import BALANCE_THRESHOLD
    shared = list(range(1, 33))                                  # 8 blocks
    caches = caches_holding([list(range(100, 164))], [shared])   # r0 16 other blocks
    r = Router(2, BS, "cache_first", caches=caches)
    prompt = shared + [50, 51, 52, 53]                           # 9 blocks, 8 on r1
    near = ReplicaLoad(0, BALANCE_THRESHOLD, 99)                 # r1 busier, within it
    d = r.choose("a", prompt, [IDLE, near])
    assert d.chosen == 1 and d.cached_blocks == (0, 8) and "longest cached prefix" in d.reason
    far = ReplicaLoad(0, BALANCE_THRESHOLD + 1, 0)
    d = r.choose("b", prompt, [IDLE, far])
    assert d.chosen == 0 and "apart" in d.reason and d.costs == (0.0, BALANCE_THRESHOLD + 1)
    half = list(range(1, 13)) + [70] * 12                        # 3 of 6 blocks on r1: half
    assert r.choose("c", half, [IDLE, IDLE]).chosen == 1
    new = [9] * 40                                               # no one holds it
    d = r.choose("d", new, [IDLE, IDLE])
    assert d.chosen == 1 and "fewest blocks (8)" in d.reason     # r1 caches 8, r0 16
    assert r.choose("e", prompt, [IDLE, DEAD]).chosen == 0       # the dead hold nothing
