"""build_step_batch's prefill columns: every chunk's positions and KV slots in one
pass (W1's first step: 16 chunks of 512 tokens), beside decode rows."""
import numpy as np

from engine.config import SchedulerConfig
from engine.core.batch_builder import build_step_batch
from engine.core.kv.block_pool import BlockPool
from engine.core.kv.counters import Counters
from engine.core.scheduler import Scheduler
from engine.request import Request, SamplingParams

BS = 4


def _commit(sched, plan):
    for c in plan.chunks:
        c.request.num_computed_tokens += c.num_tokens
        sched.kv.register_full_blocks(c.request, True)
        if c.sample:
            c.request.output_token_ids.append(5)


def test_prefill_chunks_positions_and_slots_beside_decodes():
    """A decode row, a prefix hit's chunk (from a block boundary), a whole prompt and a
    chunk the budget cuts short: each token's position counts on from its chunk's
    start and its slot is its block's in its own table."""
    counters = Counters()
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=24, max_num_seqs=8),
                      BlockPool(64, BS, counters), counters)
    params = SamplingParams(max_tokens=8, temperature=0)
    first = Request("a", list(range(1, 11)), params)
    sched.add(first)
    _commit(sched, sched.schedule())          # a's prompt: 2 full blocks indexed
    for rid, tokens in (("hit", [*range(1, 9), 50, 51, 52]), ("whole", [7] * 6),
                        ("cut", [9] * 30)):
        sched.add(Request(rid, tokens, params))
    plan = sched.schedule()
    assert [(c.request.request_id, c.start, c.num_tokens) for c in plan.chunks] == \
        [("a", 10, 1), ("hit", 8, 3), ("whole", 0, 6), ("cut", 0, 14)]
    batch, _ = build_step_batch(plan, sched.followers, BS, sched.kv.tables)
    want_pos, want_slots = [], []
    for c in plan.chunks:
        table = c.request.block_table
        for p in range(c.start, c.start + c.num_tokens):
            want_pos.append(p)
            want_slots.append(table[p // BS] * BS + p % BS)
    assert batch.positions.dtype == np.int64 and batch.slot_mapping.dtype == np.int64
    assert batch.positions.tolist() == want_pos and batch.slot_mapping.tolist() == want_slots
    assert batch.input_ids.tolist()[1:] == [50, 51, 52] + [7] * 6 + [9] * 14
    assert batch.prefill_cu_seqlens_q.tolist() == [0, 3, 9, 23]
    assert batch.logits_indices.tolist() == [0, 3, 9]       # the cut chunk does not sample
