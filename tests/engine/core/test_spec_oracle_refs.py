"""The oracle's references under the verify step's numerics (scripts/spec_sweep.py,
docs/SPECULATIVE.md "Measuring on the GPU: the oracle drafter"): a run at p = 0 emits
every token from a verify step's first row, so its outputs, proposed back, are accepted
exactly where the oracle keeps them. Float32 on the CPU (the bundled model's bf16 needs
AVX-512 bf16 linears this box may lack, and its torch path shows no near-tie): the
accepted count equals the one the oracle's own draws predict, and outputs do not move."""
import numpy as np

from benchmarks.oracle import OracleProposer
from engine import LLM, SamplingParams
from tests.helpers import load_script

KW = dict(model="default", device="cpu", dtype="float32", max_num_seqs=8,
          max_num_batched_tokens=512)
PARAMS = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)


class Recording(OracleProposer):
    """The oracle, noting per proposal how many leading drafts it kept right."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.kept_prefix = self.checked = 0

    def propose(self, reqs, rooms):
        outs = super().propose(reqs, rooms)
        for req, draft in zip(reqs, outs):
            done = len(req.output_token_ids)
            ref = self._by_request[req.request_id][done:done + len(draft)]
            kept = next((i for i, (a, b) in enumerate(zip(draft, ref)) if a != b), len(draft))
            self.kept_prefix += kept
            self.checked += min(kept + 1, len(draft))    # the drafts the verify compares
        return outs


def _k0_run(seed: int) -> tuple[list, list, list]:
    """(prompt ids, the prompts, their k = 0 greedy outputs): 6 random prompts of 24 ids."""
    rng = np.random.default_rng(seed)
    with LLM(**KW) as llm:
        ids = [rng.integers(10, llm.engine.vocab_size - 10, 24).tolist() for _ in range(6)]
        prompts = [{"prompt_token_ids": p} for p in ids]
        return ids, prompts, [list(o.outputs[0].token_ids)
                              for o in llm.generate(prompts, PARAMS)]


SPEC = {"method": "ngram", "num_speculative_tokens": 3}


def test_p0_run_references_give_acceptance_p_at_k3():
    ids, prompts, base = _k0_run(1)
    oracle = Recording(zip(ids, base), p=0.0, seed=3)
    with LLM(speculative_config=SPEC, proposer=oracle, **KW) as llm:
        c = llm.engine.counters

        def run(p):
            oracle.p, oracle.kept_prefix, oracle.checked = p, 0, 0
            a0, d0 = c.spec_decode_num_accepted_tokens, c.spec_decode_num_draft_tokens
            out = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, PARAMS)]
            return out, c.spec_decode_num_accepted_tokens - a0, \
                c.spec_decode_num_draft_tokens - d0

        refs, accepted, drafted = run(0.0)         # every draft wrong: none accepted
        assert accepted == 0 and drafted > 0 and refs == base
        oracle.set_references(zip(ids, refs))
        out, accepted, drafted = run(1.0)          # p = 1: every draft accepted
        assert out == refs and accepted == drafted > 0
        out, accepted, drafted = run(0.5)          # the oracle's own draws decide
        assert out == refs and 0 < accepted == oracle.kept_prefix < drafted


def test_per_checked_draft_acceptance_is_what_the_verifies_compared():
    """spec_sweep's per-draft acceptance (accepted / drafts a verify compared) from the
    engine's per-position counts: at p = 0.5 it equals the oracle's own count of the
    drafts each verify compared, up to drafts cut short near the length cap."""
    sweep = load_script("spec_sweep")
    assert sweep.per_draft(10, [6, 3, 1], 3) == (10 / 19, [0.6, 0.5, 1 / 3])
    assert sweep.per_draft(0, [0, 0, 0], 3) == (0.0, [0.0, 0.0, 0.0])
    ids, prompts, base = _k0_run(2)
    oracle = Recording(zip(ids, base), p=0.0, seed=5)
    with LLM(speculative_config=SPEC, proposer=oracle, **KW) as llm:
        oracle.set_references(zip(ids, [list(o.outputs[0].token_ids)
                                        for o in llm.generate(prompts, PARAMS)]))
        c, pos0 = llm.engine.counters, list(llm.engine.spec.accepted_per_pos)
        d0, steps0 = c.spec_decode_num_drafts, c.steps
        oracle.p, oracle.kept_prefix, oracle.checked = 0.5, 0, 0
        llm.generate(prompts, PARAMS)
        per_pos = [a - b for a, b in zip(llm.engine.spec.accepted_per_pos, pos0)]
        pooled, by_pos = sweep.per_draft(c.spec_decode_num_drafts - d0, per_pos, 3)
        steps = [s for s in llm.engine.stats.recent_steps if s.step > steps0]
        assert len(steps) == c.steps - steps0       # every step of the run is kept
    # each step's per-position counts (the TUI's strip): they add up to the engine's
    assert [sum(s.spec_accepted_per_pos[j] for s in steps if len(s.spec_accepted_per_pos) > j)
            for j in range(3)] == per_pos[:3]
    assert sum(s.spec_drafted_per_pos[0] for s in steps if s.spec_drafted_per_pos) \
        == sum(s.spec_verified for s in steps) == c.spec_decode_num_drafts - d0
    assert all(a <= d for s in steps
               for d, a in zip(s.spec_drafted_per_pos, s.spec_accepted_per_pos))
    assert sum(per_pos) == oracle.kept_prefix > 0
    exact = oracle.kept_prefix / oracle.checked
    assert exact * 0.95 <= pooled <= exact, (pooled, exact)
    assert len(by_pos) == 3 and all(0 < x < 1 for x in by_pos), by_pos
