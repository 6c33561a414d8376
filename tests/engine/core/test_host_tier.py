"""The host KV tier on the real model and runner (CPU, the bundled model, float32): greedy
tokens do not depend on where a block's KV lived. A multi-turn chat (each turn re-sends
the conversation so far) on a device pool too small for it: with the tier off, evicted
prefixes are recomputed; with it on, they come back from the host pool (offloaded on
eviction, reloaded on a hit); with preemption_mode=swap, preempted requests resume from
their blocks' copy in the host pool. Through chunked prefill, same-prompt dedup,
copy-on-write and async scheduling, the tokens equal a run with room for everything,
and every step's block invariants hold in both tiers (check_invariants)."""
from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.config import InvalidRequestError, make_config

BS = 16
TURNS = 3
NEW = 8
SMALL = 16          # device blocks: a conversation's history is 4-10 blocks


def chats(vocab: int = 512) -> list[list[int]]:
    """Four conversations' first user turns after one shared system prompt; the third is
    the second again (dedup: prefilled once; then copy-on-write of their shared block)."""
    g = torch.Generator().manual_seed(3)
    rand = lambda n: torch.randint(1, vocab, (n,), generator=g).tolist()
    system = rand(2 * BS + 7)
    first = [system + rand(n) for n in (40, 60, 25)]
    return [first[0], first[1], list(first[1]), first[2]]


def run_chat(**kw) -> tuple[LLM, list[list[int]]]:
    """TURNS rounds; each round's prompt is the history so far + a new user turn."""
    llm = LLM(model="dummy:tiny", device="cpu", dtype="float32", block_size=BS, check_invariants=True, **kw)
    g = torch.Generator().manual_seed(5)
    history, outputs = chats(), []
    params = SamplingParams(max_tokens=NEW, temperature=0, ignore_eos=True)
    for _ in range(TURNS):
        outs = llm.generate([{"prompt_token_ids": h} for h in history], params)
        tokens = [list(o.outputs[0].token_ids) for o in outs]
        outputs += tokens
        user = torch.randint(1, 512, (20,), generator=g).tolist()
        history = [h + t + user for h, t in zip(history, tokens)]
    return llm, outputs


def host_gib(llm: LLM, blocks: int) -> float:
    kv = llm.engine.executor.runner.kv_cache
    return blocks * (kv[:, :, :1].numel() * kv.element_size()) / 2 ** 30


@pytest.fixture(scope="module")
def reference():
    llm, out = run_chat(num_blocks=256)
    return llm, out


def counters(llm: LLM):
    return llm.engine.stats.counters


def test_prefix_blocks_come_back_from_the_host_tier(reference):
    """Tier off: the small pool recomputes evicted history; tier on: the same tokens, with
    the history's blocks reloaded (fewer prompt tokens computed)."""
    ref_llm, ref = reference
    kw = dict(num_blocks=SMALL, max_num_batched_tokens=64, max_num_seqs=2)
    off_llm, off = run_chat(**kw)
    on_llm, on = run_chat(kv_offloading_size=host_gib(ref_llm, 64), **kw)
    assert off == ref and on == ref
    c_off, c_on = counters(off_llm), counters(on_llm)
    assert c_off.evictions > 0 and c_off.kv_offload_blocks == 0
    assert c_on.kv_offload_blocks > 0 and c_on.kv_reload_blocks > 0
    assert 0 < c_on.host_prefix_hit_tokens <= c_on.prefix_hit_tokens
    assert c_on.prefill_tokens < c_off.prefill_tokens     # reloaded, not recomputed
    assert c_on.dedup_joined > 0 and c_on.cow_copies > 0
    on_llm.engine.clear_prefix_cache()
    assert on_llm.engine.host.pool.num_free == on_llm.engine.host.num_blocks


@pytest.mark.parametrize("async_scheduling,budget", [(False, 512), (True, 32)])
def test_swapped_requests_resume_with_the_same_tokens(reference, async_scheduling, budget):
    """preemption_mode=swap: preempted requests' blocks go to the host and come back;
    their tokens equal recompute's (and the roomy run's), chunked or not, async or not."""
    ref_llm, ref = reference
    kw = dict(num_blocks=12, max_num_batched_tokens=budget, async_scheduling=async_scheduling,
              enable_prefix_caching=False, kv_offloading_size=host_gib(ref_llm, 64))
    swap_llm, swapped = run_chat(preemption_mode="swap", **kw)
    assert swapped == ref
    c = counters(swap_llm)
    assert c.preemptions > 0 and c.swap_outs > 0 and c.swap_ins == c.swap_outs
    assert c.swap_fallbacks == 0
    if not async_scheduling:       # the same run with recompute: more prompt tokens
        rec_llm, rec = run_chat(preemption_mode="recompute", **kw)
        assert rec == ref and counters(rec_llm).swap_outs == 0
        assert c.prefill_tokens < counters(rec_llm).prefill_tokens


def test_a_full_host_tier_falls_back_to_recompute(reference):
    """A host tier smaller than a preempted request's blocks: it recomputes, counted and
    in the event log; the tokens do not change."""
    ref_llm, ref = reference
    llm, out = run_chat(num_blocks=12, enable_prefix_caching=False, preemption_mode="swap",
                        kv_offloading_size=host_gib(ref_llm, 1))
    assert out == ref
    c = counters(llm)
    assert c.preemptions > 0 and c.swap_fallbacks > 0
    assert any(e.kind == "swap_fallback" for e in llm.engine.events.recent())


def test_kv_offloading_size_is_validated_once():
    for bad in (-1, float("nan"), "1", True):
        with pytest.raises(InvalidRequestError, match="kv_offloading_size"):
            make_config(kv_offloading_size=bad)
    with pytest.raises(InvalidRequestError, match="preemption_mode"):
        make_config(preemption_mode="spill")
    assert make_config(kv_offloading_size=2).kv_offloading_size == 2
