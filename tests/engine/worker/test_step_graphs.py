"""The CUDA-graph step buffers on the CPU: whole engine runs where every step goes
through engine/worker/cuda_graphs.py's padded buffers (eagerly: no capture on the CPU), with
the unified attention's torch oracle standing in for the Triton kernel. Greedy tokens
must equal the plain CPU engine's through chunked prefills, prefix hits, preemption and
async-scheduled decodes; this checks the buffer filling (padding, query start
locations, sequence lengths, block tables, logits rows) that the GPU graphs replay."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engine import LLM, SamplingParams
from engine.worker.cuda_graphs import StepGraphs, mixed_buckets, verify_buckets
from kernels import reference
from kernels.unified_attention import unified_attention_reference

KW = dict(model="dummy:tiny", device="cpu", dtype="float32", block_size=4, num_blocks=40,
          max_num_batched_tokens=48, max_num_seqs=8)


def _prompts():
    g = torch.Generator().manual_seed(2)
    shared = torch.randint(0, 512, (24,), generator=g).tolist()
    lens = [3, 70, 9, 41, 1, 17, 55, 6, 30, 12]
    out = [{"prompt_token_ids": torch.randint(0, 512, (n,), generator=g).tolist()} for n in lens]
    out += [{"prompt_token_ids": shared + [i, i + 1]} for i in range(4)]   # prefix hits
    return out


def _greedy(llm):
    outs = llm.generate(_prompts(), SamplingParams(max_tokens=20, temperature=0,
                                                   ignore_eos=True))
    return [list(o.outputs[0].token_ids) for o in outs]


def _through_buffers(llm, max_batch=8) -> StepGraphs:
    """Route the runner's steps through padded StepGraphs buffers (no capture)."""
    runner = llm.engine.executor.runner
    names = [n for n in dir(reference) if not n.startswith("_") and callable(getattr(reference, n))]
    ops = SimpleNamespace(**{n: getattr(reference, n) for n in names},
                          paged_unified_attention=unified_attention_reference)
    runner.model.ops = ops
    for layer in runner.model.attention_layers():
        layer.ops = ops
    runner.graphs = StepGraphs(runner, max_batch, use_graphs=False, pad=True,
                               max_mixed_tokens=KW["max_num_batched_tokens"])
    return runner.graphs


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_padded_buffer_steps_match_plain_engine(async_scheduling):
    want = _greedy(LLM(async_scheduling=async_scheduling, **KW))
    llm = LLM(async_scheduling=async_scheduling, **KW)
    graphs = _through_buffers(llm)
    assert _greedy(llm) == want
    counters = llm.engine.stats.counters
    assert counters.preemptions > 0 and counters.prefix_hit_tokens > 0
    assert graphs.replays["mixed"] > 0 and graphs.replays["decode"] > 0


def test_bucket_choice():
    graphs = SimpleNamespace(decode_buckets=[1, 2, 4, 8], mixed_buckets=mixed_buckets(100),
                             verify_buckets=verify_buckets(10), max_seqs=16, pad=True)
    assert mixed_buckets(100)[-2:] == [64, 100] and mixed_buckets(16) == [16]
    assert verify_buckets(10) == [1, 2, 4, 8, 16] and verify_buckets(0) == []

    def batch(decodes, chunks, verify=False):
        return SimpleNamespace(decode_only=not chunks, num_decodes=decodes,
                               num_prefills=len(chunks), num_tokens=decodes + sum(chunks),
                               draft_rows=np.arange(decodes) if verify else None)
    key = lambda *a: StepGraphs.key(graphs, batch(*a))
    assert key(3, []) == ("decode", 4)
    assert key(12, [], True) == ("verify", 16)    # verified positions: decode rows
    assert key(12, [4], True) == ("mixed", 16)
    assert key(17, [], True) is None              # wider than every capacity: eager
    assert key(3, [10]) == ("mixed", 16)
    assert key(0, [65]) == ("mixed", 100)
    assert key(0, [101]) is None                  # over the budget captured: eager
    assert key(12, [1] * 5) is None               # more sequences than the capacity
    graphs.decode_buckets = [1, 2]
    assert key(5, []) == ("mixed", 16)            # past the decode buckets: a mixed graph
    graphs.verify_buckets = []                    # started without speculation
    assert key(5, [], True) == ("mixed", 16)


def test_fill_pads_mixed_step():
    """Buffers after one mixed step: slots -1 and no sequence past the real tokens."""
    llm = LLM(**KW)
    graphs = _through_buffers(llm)
    from engine.core.batch_builder import build_step_batch
    eng = llm.engine
    for p in (_prompts()[0], _prompts()[2]):   # 3 + 9 tokens: padded to 16
        llm.add_request(p, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    plan = eng.scheduler.schedule()
    batch, _ = build_step_batch(plan, eng.scheduler.followers, eng.pool.block_size,
                                   eng.scheduler.kv.tables)
    kind, size = graphs.key(batch)
    graphs.buffers.fill(batch, size, kind == "mixed")
    buf, n = graphs.buffers, batch.num_tokens
    assert kind == "mixed" and size > n
    ids, _, slots = buf.views(size)
    assert torch.equal(slots[:n], torch.from_numpy(batch.slot_mapping))
    assert torch.equal(ids[:n], torch.from_numpy(batch.input_ids))
    assert (slots[n:] == -1).all()
    nseq = batch.num_prefills
    qsl = buf.query_start_loc.numpy()
    assert np.array_equal(qsl[:nseq + 1], batch.prefill_cu_seqlens_q)
    assert (qsl[nseq + 1:] == n).all()
    assert np.array_equal(buf.seq_lens[:nseq].numpy(), batch.prefill_context_lens)
