"""A verify step's batch (docs/SPECULATIVE.md "One step"): every verified position is a
decode row of its own, after the plain decodes, with its position, context length
position + 1, its request's block-table row and the slot of that position; its logits
row is its decode row. A step of decodes and verifies alone is a decode-only step whose
rows are sampled in order (the decode graphs' in-graph argmax serves it); a mixed step
keeps the verify rows with the decodes, before the prefill chunks. In-process (to look
at each plan and batch), n-gram drafts on the bundled model."""
import numpy as np

from engine import LLM, SamplingParams
from engine.core import core as core_module

LINE = "To be, or not to be, that is the question.\n"
PROMPTS = [LINE * 3, "KING.\nWhat news? " * 6, f"{LINE * 2}HAMLET.\n",
           "First Citizen.\nBefore we proceed any further, hear me speak.\n" * 3]
# synchronous: every step proposes (under async scheduling most steps that verify
# nothing chain without proposing, docs/SPECULATIVE.md), so verify steps come with
# prefill chunks too
KW = dict(model="default", device="cpu", block_size=8, num_blocks=64,
          max_num_batched_tokens=32, max_num_seqs=4, check_invariants=True,
          async_scheduling=False)
SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
        "prompt_lookup_max": 3}


def _check_verify_rows(plan, batch, block_size: int) -> None:
    d_plain = len(plan.decodes)
    row = d_plain
    for chunk in plan.verifies:
        req, n = chunk.request, chunk.num_tokens
        rows = slice(row, row + n)
        pos = np.arange(chunk.start, chunk.start + n)
        assert batch.positions[rows].tolist() == pos.tolist()
        assert batch.decode_context_lens[rows].tolist() == (pos + 1).tolist()
        table = np.asarray(req.block_table)
        assert (batch.decode_block_tables[rows, :len(table)] == table).all()
        want_slots = table[pos // block_size] * block_size + pos % block_size
        assert batch.slot_mapping[rows].tolist() == want_slots.tolist()
        last = req.token_slice(chunk.start, chunk.start + 1)
        assert batch.input_ids[rows].tolist() == last + list(chunk.draft)
        row += n
    assert batch.num_decodes == row                  # verify rows are decode rows
    # their samples: one range of sample rows, each reading its own decode row
    lo = int(batch.draft_rows[0])
    assert batch.draft_rows.tolist() == list(range(lo, lo + row - d_plain))
    logits_rows = batch.logits_indices[batch.sample_rows[batch.draft_rows]]
    assert logits_rows.tolist() == list(range(d_plain, row))
    assert batch.draft_ids.tolist() == [t for c in plan.verifies for t in (*c.draft, -1)]
    if not plan.prefills:
        assert batch.decode_only and batch.samples_in_order


def test_verify_steps_are_decode_rows(monkeypatch):
    seen = {"decode_only": 0, "mixed": 0}
    build = core_module.build_step_batch

    def checked(plan, followers, block_size, tables, device_fed=False):
        batch, requests = build(plan, followers, block_size, tables, device_fed)
        if plan.verifies:
            _check_verify_rows(plan, batch, block_size)
            seen["mixed" if plan.prefills else "decode_only"] += 1
        return batch, requests

    monkeypatch.setattr(core_module, "build_step_batch", checked)
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    with LLM(**KW) as llm:
        want = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, params)]
    with LLM(speculative_config=SPEC, **KW) as llm:
        # staggered: later prompts prefill while earlier ones verify (mixed steps)
        got = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, params)]
        accepted = llm.engine.counters.spec_decode_num_accepted_tokens
    assert got == want and accepted > 0
    assert seen["decode_only"] > 0 and seen["mixed"] > 0, seen
