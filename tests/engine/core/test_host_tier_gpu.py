"""The host KV tier on a GPU: the pinned pool is exactly its size, the copies of one step
(on the copy stream, through the pinned pool's CUDA view) move the bytes they should in
the documented order, and an engine with a pool too small for a multi-turn chat gives
the same float32 greedy tokens with the tier on (blocks reloaded) as with room for
everything (blocks kept on the device)."""
import numpy as np
import pytest
import torch

from engine.worker.kv_transfer import HostKVCache, KVTransfer, word_view
from tests.engine.core import test_host_tier as chat

pytestmark = pytest.mark.gpu


def xfer(off_src=(), off_dst=(), re_src=(), re_dst=()) -> KVTransfer:
    a = lambda v: np.array(v, dtype=np.int64)
    return KVTransfer(a(off_src), a(off_dst), a(re_src), a(re_dst))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_one_steps_copies_move_the_right_bytes_in_order(dtype):
    kv = torch.randn(2, 3, 10, 16, 4, 64, device="cuda").to(dtype)
    host = HostKVCache(kv, 6)
    assert host.host.is_pinned() and host.host.untyped_storage().nbytes() == \
        6 * host.bytes_per_block
    before = kv.clone()
    host.transfer(xfer([0, 1, 2], [5, 3, 4]))
    # one step: block 7 is offloaded (to host 0) and reused as a reload destination
    # (of host 5, which holds block 0): the offload reads it before the reload writes it
    host.transfer(xfer([7], [0], [5, 3], [7, 8]))
    torch.cuda.synchronize()
    assert torch.equal(kv[:, :, 7], before[:, :, 0]) and torch.equal(kv[:, :, 8], before[:, :, 1])
    words = word_view(before).cpu()
    assert torch.equal(host.host[:, :, 0], words[:, :, 7])       # offloaded before reuse
    assert torch.equal(host.host[:, :, 5], words[:, :, 0])
    out, inn = host.copy_seconds()
    assert out > 0 and inn > 0


def test_multi_turn_chat_tokens_equal_with_the_tier_on():
    base = dict(model="dummy:qwen2.5-0.5b", device="cuda", dtype="float32", block_size=16,
                max_num_batched_tokens=64, enforce_eager=True)
    orig = chat.LLM

    def llm(**kw):
        kw.pop("model", None)
        return orig(**{**kw, **base, "device": "cuda", "dtype": "float32"})
    chat.LLM = llm
    try:
        ref_llm, ref = chat.run_chat(num_blocks=512)
        on_llm, on = chat.run_chat(num_blocks=chat.SMALL, max_num_seqs=2,
                                   kv_offloading_size=chat.host_gib(ref_llm, 64))
    finally:
        chat.LLM = orig
    assert on == ref
    c = on_llm.engine.stats.counters
    assert c.kv_offload_blocks > 0 and c.kv_reload_blocks > 0 and c.host_prefix_hit_tokens > 0
