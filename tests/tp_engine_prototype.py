"""TP=2 through LLM.generate on the pre-issue-12 engine, by patching two seams: the
integration recipe run end to end before the runner wires it (delete once it does).

    python -m tests.tp_engine_prototype llama qwen2 qwen3 gpt2

Greedy tokens of TP=2 vs TP=1 on a small pool (preemptions) with a shared prefix (prefix
hits), the tiny HF checkpoints saved as a sharded index. Not collected by pytest: it
monkeypatches engine.core.load_model and ModelRunner.execute, which issue 12 rewrites.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

import engine.core as core
from engine import LLM, SamplingParams
from engine.distributed.step import StepArrays
from engine.distributed.worker import TPWorkerGroup, WorkerSpec
from engine.runner import ModelRunner
from tests.hf_models import make_checkpoint
from tests.tp_helpers import shard_checkpoint

LOAD, EXECUTE = core.load_model, ModelRunner.execute
GROUP: dict[str, TPWorkerGroup] = {}


def tp_load_model(name, device, dtype, seed):
    """Recipe steps 1-3: workers, rank 0's shard, every rank ready."""
    group = GROUP["g"] = TPWorkerGroup(WorkerSpec(name, 2))
    loaded = LOAD(name, device, dtype, seed, tp=group.start())
    group.wait_ready()
    return loaded


def _np(t):
    return None if t is None else t.cpu().numpy()


def tp_execute(self, plan, token_source=None):
    """Recipe step 5: the step as numpy arrays to every rank, rank 0's forward, its logits."""
    inputs = self.prepare(plan)
    m = inputs.meta
    step = StepArrays(
        input_ids=_np(inputs.input_ids), positions=_np(inputs.positions),
        slot_mapping=_np(m.slot_mapping), logits_indices=_np(inputs.logits_indices),
        num_decode_tokens=m.num_decode_tokens, decode_block_tables=_np(m.decode_block_tables),
        decode_context_lens=_np(m.decode_context_lens),
        prefill_block_tables=_np(m.prefill_block_tables),
        prefill_cu_seqlens_q=_np(m.prefill_cu_seqlens_q),
        prefill_context_lens=_np(m.prefill_context_lens),
        prefill_max_seqlen_q=m.prefill_max_seqlen_q,
        cow_src=np.array([s for s, _ in plan.copies], np.int64),
        cow_dst=np.array([d for _, d in plan.copies], np.int64))

    def forward(_):
        self.copy_blocks(plan.copies)
        return self.model(inputs.input_ids, inputs.positions, m, inputs.logits_indices)
    self.forward_calls += 1
    return GROUP["g"].run(step, forward), inputs.sample_chunks


def generate(path: str, tp2: bool, prompts, params, **kw):
    core.load_model = tp_load_model if tp2 else LOAD
    ModelRunner.execute = tp_execute if tp2 else EXECUTE
    llm = LLM(model=path, device="cpu", dtype="float32", async_scheduling=False, **kw)
    try:
        if tp2:   # recipe step 4: same pool on every rank
            GROUP["g"].allocate_kv(llm.engine.pool.num_blocks, llm.engine.config.block_size)
        outs = llm.generate(prompts, params)
        return [o.outputs[0].token_ids for o in outs], llm.engine.stats.counters
    finally:
        if tp2:
            GROUP["g"].shutdown()


def main(kinds: list[str]) -> None:
    rng = np.random.default_rng(0)
    shared = rng.integers(0, 320, 40).tolist()
    prompts = [shared + rng.integers(0, 320, n).tolist() for n in (5, 9, 30, 3, 17, 50)]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    knobs = dict(num_blocks=40, block_size=4, max_num_seqs=6)
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            path = Path(tmp) / kind
            make_checkpoint(kind, path)
            shard_checkpoint(path)
            ref, _ = generate(str(path), False, prompts + [shared], params, **knobs)
            got, c = generate(str(path), True, prompts + [shared], params, **knobs)
            print(f"{kind}: TP=2 greedy == TP=1: {got == ref} (preemptions {c.preemptions}, "
                  f"prefix hits {c.prefix_hits}, generated {c.generated_tokens})")


if __name__ == "__main__":
    main(sys.argv[1:] or ["llama"])
