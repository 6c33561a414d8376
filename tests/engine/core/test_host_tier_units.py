"""The host KV tier's bookkeeping (engine/core/kv/host_tier.py) without a model: where a
block goes when the device evicts it, what a lookup finds, what a swap holds, and what
a failed copy leaves behind. The token-level checks run on the fake runner
(tests/engine/core/kv_checking.py), whose host pool holds token ids."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.config import SchedulerConfig
from engine.core.kv.block_pool import BlockPool
from engine.core.kv.counters import Counters
from engine.core.kv.host_tier import HostTier
from engine.core.scheduler import Scheduler
from engine.request import SamplingParams
from tests.engine.core.kv_checking import check_all, expected, make_engine
from tests.engine.core.test_scheduler_units import compute, end, req
from tests.helpers import add_request

BS = 4


class Copies:
    """Stands in for the executor: records the transfers it is sent."""

    def __init__(self):
        self.sent = []

    def transfer_kv(self, xfer):
        self.sent.append(xfer)


def make(num_blocks=4, host_blocks=4, **knobs):
    counters = Counters()
    pool = BlockPool(num_blocks, BS, counters)
    host = HostTier(host_blocks, pool, 1000, counters)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64, **knobs), pool, counters, host)
    return sched, pool, host, counters


def run_alone(sched, r):
    """Admit, compute and end one request (its full blocks stay cached)."""
    sched.add(r)
    compute(sched, sched.schedule())
    end(sched, r)


def test_an_evicted_block_goes_to_the_host_under_its_key_and_comes_back():
    sched, pool, host, counters = make()
    copies = Copies()
    a = req("a", range(1, 10))                       # 2 full blocks (+1 token)
    run_alone(sched, a)
    keys = {b: k for b, k in pool.index.items()}
    assert len(keys) == 2 and host.send(copies) is None   # nothing moved yet
    run_alone(sched, req("b", range(20, 36)))        # 4 blocks: a's 2 evicted
    step = host.send(copies)
    assert sorted(copies.sent[-1].offload_src.tolist()) == sorted(keys)
    assert sorted(step.offloaded) == sorted(keys) and counters.kv_offload_blocks == 2
    assert sorted(k for _, k in host.pool.index.items()) == sorted(keys.values())
    assert not set(keys.values()) & {k for _, k in pool.index.items()}
    host.check([])

    again = req("a2", list(range(1, 10)) + [50, 51])
    sched.add(again)
    plan = sched.schedule()
    assert again.num_computed_tokens == 8 and again.num_host_cached_tokens == 8
    assert plan.prefix_hits == [("a2", tuple(again.block_table[:2]))]
    assert [c.start for c in plan.prefills] == [8]   # only the rest is computed
    step = host.send(copies)
    xfer = copies.sent[-1]
    assert xfer.reload_dst.tolist() == again.block_table[:2]
    assert step.reloads == {"a2": again.block_table[:2]} and counters.kv_reload_blocks == 2
    # the reloaded blocks are in the device index now; the host keeps its copies (held
    # while their reload was queued: of the three b blocks that a2's blocks evicted, two
    # took the other two host blocks and the third was dropped)
    assert {pool.index.get(k) for k in keys.values()} == set(again.block_table[:2])
    assert all(host.lookup(k) is not None for k in keys.values())
    assert counters.kv_offload_dropped == 1 and counters.host_prefix_hit_tokens == 8
    pool.check(sched.block_tables())
    host.check([])


def test_host_hits_are_held_before_the_reload_blocks_evict_into_a_full_host():
    """The device blocks a lookup takes for its host hits evict device blocks, whose
    offload wants host blocks: a full host drops those offloads rather than evict the
    very blocks the lookup is about to reload."""
    sched, pool, host, counters = make(num_blocks=4, host_blocks=2)
    a = list(range(1, 9))                           # 2 full blocks
    run_alone(sched, req("a", a))
    keys = [k for _, k in pool.index.items()]
    run_alone(sched, req("b", range(20, 36)))       # evicts a's 2 into the (full) host
    host.send(Copies())
    held = sorted(host.lookup(k) for k in keys)
    again = req("a2", a + [50, 51])
    sched.add(again)
    sched.schedule()
    assert again.num_host_cached_tokens == 8
    assert sorted(host.lookup(k) for k in keys) == held and counters.kv_offload_dropped == 3
    copies = Copies()
    host.send(copies)
    assert sorted(copies.sent[0].reload_src.tolist()) == held
    host.check([])


def test_the_host_evicts_its_least_recently_used_block():
    sched, pool, host, _ = make(num_blocks=2, host_blocks=2)
    keys = []
    for i, rid in enumerate("abc"):                  # 2 full blocks each: each evicts
        run_alone(sched, req(rid, range(10 * i + 1, 10 * i + 9)))   # the one before
        keys.append({k for _, k in pool.index.items()})
        host.send(Copies())
    assert {k for _, k in host.pool.index.items()} == keys[1]    # a's went first
    assert host.pool.counters.evictions == 2
    host.check([])


def test_prefix_caching_off_stores_and_finds_nothing_in_the_host():
    sched, pool, host, counters = make()
    run_alone(sched, req("a", range(1, 10)))
    sched.knobs = sched.knobs.replace(enable_prefix_caching=False)
    run_alone(sched, req("b", range(20, 36)))        # evicts a's blocks: not stored
    assert host.send(Copies()) is None and counters.kv_offload_blocks == 0
    assert counters.evictions == 2 and len(host.pool.index) == 0


def test_clearing_the_prefix_cache_clears_both_tiers():
    eng = make_engine(6, 2, host_blocks=8)
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    for p in ([1, 2, 3, 4, 5, 6, 7], [9, 8, 7, 6, 5, 4, 3], [11, 12, 13, 14, 15, 16, 17]):
        add_request(eng, {"prompt_token_ids": p}, params)
        while eng.has_unfinished():
            eng.step()
    assert eng.host.pool.num_cached > 0
    eng.clear_prefix_cache()
    assert eng.host.pool.num_free == eng.host.num_blocks and not len(eng.host.pool.index)


def swap_engine(**kw):
    """A pool of 8 blocks of 2 tokens: two 7-token prompts growing to 13 preempt."""
    eng = make_engine(8, 2, preemption_mode="swap", enable_prefix_caching=False, **kw)
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    prompts = [[1, 2, 3, 4, 5, 6, 7], [30, 31, 32, 33, 34, 35, 36]]
    return eng, params, prompts, [add_request(eng, {"prompt_token_ids": p}, params)
                                  for p in prompts]


def step_until(eng, cond, limit=100):
    for _ in range(limit):
        if cond():
            return
        eng.step()
        check_all(eng)
    raise AssertionError("condition never met")


def test_a_swapped_out_request_resumes_with_its_tokens_and_gives_its_host_blocks_back():
    eng, params, prompts, reqs = swap_engine(host_blocks=8, async_scheduling=False)
    step_until(eng, lambda: any(r.swap is not None for r in reqs))
    swapped = next(r for r in reqs if r.swap is not None)
    assert eng.host.pool.num_used == len(swapped.swap.blocks)
    assert any(e.kind == "swap_out" for e in eng.events.recent())
    view = eng.snapshot().request(swapped.request_id)     # the TUI's "×1: swapped"
    assert view.state == "preempted" and view.swapped
    step_until(eng, lambda: not eng.has_unfinished())
    for r, p in zip(reqs, prompts):
        assert r.output_token_ids == expected(p, params, eng.eos_token_ids)[0]
    c = eng.stats.counters
    assert c.swap_outs == c.swap_ins > 0 and eng.host.pool.num_free == eng.host.num_blocks
    assert any(e.kind == "swap_in" for e in eng.events.recent())


def test_cancelling_a_swapped_out_request_frees_its_host_blocks():
    eng, _, _, reqs = swap_engine(host_blocks=8, async_scheduling=False)
    step_until(eng, lambda: any(r.swap is not None for r in reqs))
    swapped = next(r for r in reqs if r.swap is not None)
    eng.abort(swapped.request_id)
    assert swapped.swap is None and eng.host.pool.num_free == eng.host.num_blocks
    check_all(eng)


def test_swap_without_a_host_tier_recomputes_and_says_so():
    eng, params, prompts, reqs = swap_engine()
    step_until(eng, lambda: not eng.has_unfinished())
    c = eng.stats.counters
    assert c.preemptions > 0 and c.swap_fallbacks == c.preemptions and c.swap_outs == 0
    assert any(e.kind == "swap_fallback" for e in eng.events.recent())
    assert not any(v.swapped for v in eng.snapshot().requests)


def test_a_failed_copy_fails_its_step_and_leaves_no_block_behind():
    """The transfer raises: the plan's requests end with the error, the swapped-out
    request's record is dropped (its host blocks are free; it recomputes), and the
    engine serves on with the same tokens for the others."""
    eng, params, prompts, reqs = swap_engine(host_blocks=8, async_scheduling=False)
    real = eng.executor.runner.transfer_kv
    calls = []

    def failing(xfer):
        calls.append(xfer)
        if len(calls) == 1:
            raise RuntimeError("copy engine fault")
        real(xfer)
    eng.executor.runner.transfer_kv = failing
    while not calls:
        eng.step()
    assert eng.stats.last_error == "RuntimeError: copy engine fault"
    eng.stats.last_error = None          # (check_all asserts none)
    assert all(r.swap is None for r in reqs) and eng.host.pool.num_free == eng.host.num_blocks
    failed = [r for r in reqs if r.finish_reason == "error"]
    assert failed
    step_until(eng, lambda: not eng.has_unfinished())
    for r, p in zip(reqs, prompts):
        if r not in failed:
            assert r.output_token_ids == expected(p, params, eng.eos_token_ids)[0]


def test_host_blocks_follow_the_kv_offloading_size():
    eng = make_engine(6, 2, host_blocks=5)
    assert eng.host.num_blocks == 5 and eng.host.bytes_per_block > 0
    assert make_engine(6, 2).host is None


def test_metrics_carry_vllms_kv_offload_families_by_transfer_type():
    """/metrics (roseplay/serve/metrics.py) from the engine's own EngineStats after a run
    that offloads and reloads: vLLM's names, labels and byte counts."""
    from prometheus_client.parser import text_string_to_metric_families

    from engine.core.stats import engine_stats
    from roseplay.serve.metrics import ServerMetrics

    eng = make_engine(6, 2, host_blocks=8)
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    for p in ([1, 2, 3, 4, 5, 6, 7], [9, 8, 7, 6, 5, 4, 3], [1, 2, 3, 4, 5, 6, 8]):
        add_request(eng, {"prompt_token_ids": p}, params)
        while eng.has_unfinished():
            eng.step()
    c = eng.stats.counters
    assert c.kv_offload_blocks > 0 and c.kv_reload_blocks > 0

    class Loop:
        def engine_stats(self):
            return engine_stats(eng, 0.0)
    text = ServerMetrics(Loop(), "tiny").render().decode()
    samples = {(s.name, s.labels.get("transfer_type")): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    size = eng.host.bytes_per_block
    assert {s.labels.get("engine") for fam in text_string_to_metric_families(text)
            for s in fam.samples if "kv_offload" in s.name} == {"0"}    # vLLM's engine label
    assert samples["vllm:kv_offload_total_bytes_total", "GPU_to_CPU"] == c.kv_offload_blocks * size
    assert samples["vllm:kv_offload_total_bytes_total", "CPU_to_GPU"] == c.kv_reload_blocks * size
    assert samples["vllm:kv_offload_total_time_total", "GPU_to_CPU"] > 0
    assert samples["vllm:kv_offload_size_count", "CPU_to_GPU"] >= 1
    assert samples["vllm:kv_offload_size_sum", "CPU_to_GPU"] == c.kv_reload_blocks * size
    eng_off = make_engine(6, 2)

    class Off:
        def engine_stats(self):
            return engine_stats(eng_off, 0.0)
    assert "kv_offload" not in ServerMetrics(Off(), "tiny").render().decode()


def test_snapshots_show_the_host_tier_its_moves_and_each_requests_host_hits():
    """The snapshot (also as it crosses the process seam) carries the host blocks' states
    and refcounts, each step's blocks and bytes moved each way, and per request the
    prompt tokens reloaded from the host."""
    from engine.core.core import LLMEngine
    from engine.config import make_config
    from engine.ipc.protocol import decode_snapshot, encoder, snapshot_frame
    from tests.engine.core.kv_checking import host_gib

    eng = LLMEngine(make_config(model="dummy:tiny", device="cpu", dtype="float32",
                                num_blocks=6, block_size=2, kv_offloading_size=host_gib(2, 8),
                                check_invariants=True))
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    reqs = [add_request(eng, {"prompt_token_ids": p}, params)
            for p in ([1, 2, 3, 4, 5, 6, 7], [9, 8, 7, 6, 5, 4, 3], [1, 2, 3, 4, 5, 6, 8])]
    while eng.has_unfinished():
        eng.step()
    snap = decode_snapshot(encoder.encode(snapshot_frame(eng.snapshot())))
    assert snap.host_num_blocks == 8 and snap.kv_bytes_per_block == eng.host.bytes_per_block
    assert (snap.host_block_state == eng.host.pool.states()).all()
    assert (snap.host_block_state == 2).sum() == eng.host.pool.num_cached > 0
    moved = [(s.blocks_to_host, s.blocks_from_host, s.bytes_to_host, s.bytes_from_host)
             for s in snap.recent_steps]
    assert sum(m[0] for m in moved) == snap.counters.kv_offload_blocks > 0
    assert sum(m[1] for m in moved) == snap.counters.kv_reload_blocks > 0
    assert all(m[2] == m[0] * snap.kv_bytes_per_block and m[3] == m[1] * snap.kv_bytes_per_block
               for m in moved)
    views = {r.request_id: r for r in snap.requests}
    third = views[reqs[2].request_id]
    assert third.host_cached_tokens == reqs[2].num_host_cached_tokens > 0
    assert third.cached_tokens >= third.host_cached_tokens
    kinds = {e.kind for e in snap.events}
    assert {"offload", "reload"} <= kinds


@pytest.mark.parametrize("dtype,head_dim", [(torch.bfloat16, 64), (torch.float16, 3),
                                            (torch.float32, 5)])
def test_the_host_pool_copies_bytes_in_the_documented_order(dtype, head_dim):
    """HostKVCache on CPU (the CUDA path's order: reload reads, offload gathers, then the
    writes): a device block offloaded and reused as a reload destination in one step is
    read before it is overwritten; any dtype and row width moves as whole words."""
    from engine.worker.kv_transfer import HostKVCache, KVTransfer, word_view
    a = lambda v: np.array(v, dtype=np.int64)
    kv = torch.randn(2, 3, 10, 4, 2, head_dim).to(dtype)
    host = HostKVCache(kv, 6)
    assert host.bytes_per_block == 2 * 3 * 4 * 2 * head_dim * kv.element_size()
    before = kv.clone()
    host.transfer(KVTransfer(a([0, 1, 2]), a([5, 3, 4]), a([]), a([])))
    host.transfer(KVTransfer(a([7]), a([0]), a([5, 3]), a([7, 8])))
    assert torch.equal(kv[:, :, 7], before[:, :, 0]) and torch.equal(kv[:, :, 8], before[:, :, 1])
    assert torch.equal(host.host[:, :, 0], word_view(before)[:, :, 7])
    assert torch.equal(kv[:, :, 9], before[:, :, 9])


def test_a_large_steps_copies_go_in_bounded_slices_offloads_first(monkeypatch):
    """A step whose buffers would pass STAGING_BYTES (a long request swapped) is cut into
    slices: every offload slice before any reload slice, so no device block a reload
    writes is gathered by an offload after it."""
    from engine.worker.kv_transfer import HostKVCache, KVTransfer
    a = lambda v: np.array(v, dtype=np.int64)
    host = HostKVCache(torch.zeros(2, 1, 8, 4, 1, 64), 8)
    monkeypatch.setattr("engine.worker.kv_transfer.STAGING_BYTES", 3 * host.bytes_per_block)
    parts = host._slices(KVTransfer(a(range(5)), a(range(5)), a([6, 7]), a([1, 2])))
    small = host._slices(KVTransfer(a([0]), a([1]), a([2]), a([3])))
    assert [(p.offload_src.tolist(), p.reload_src.tolist()) for p in parts] == \
        [([0, 1, 2], []), ([3, 4], []), ([], [6, 7])]
    assert len(small) == 1
