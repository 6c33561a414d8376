"""The oracle's references under the verify step's numerics (scripts/spec_sweep.py,
docs/SPECULATIVE.md "Measuring on the GPU: the oracle drafter"): a run at p = 0 emits
every token from a verify step's first row, so its outputs, proposed back, are accepted
exactly where the oracle keeps them. Float32 on the CPU (the bundled model's bf16 needs
AVX-512 bf16 linears this box may lack, and its torch path shows no near-tie): the
accepted count equals the one the oracle's own draws predict, and outputs do not move."""
import numpy as np

from benchmarks.oracle import OracleProposer
from engine import LLM, SamplingParams

KW = dict(model="default", device="cpu", dtype="float32", max_num_seqs=8,
          max_num_batched_tokens=512)
PARAMS = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)


class Recording(OracleProposer):
    """The oracle, noting per proposal how many leading drafts it kept right."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.kept_prefix = 0

    def propose(self, reqs, rooms):
        outs = super().propose(reqs, rooms)
        for req, draft in zip(reqs, outs):
            done = len(req.output_token_ids)
            ref = self._by_request[req.request_id][done:done + len(draft)]
            self.kept_prefix += next((i for i, (a, b) in enumerate(zip(draft, ref)) if a != b),
                                     len(draft))
        return outs


def test_p0_run_references_give_acceptance_p_at_k3():
    rng = np.random.default_rng(1)
    with LLM(**KW) as llm:
        ids = [rng.integers(10, llm.engine.vocab_size - 10, 24).tolist() for _ in range(6)]
        prompts = [{"prompt_token_ids": p} for p in ids]
        base = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, PARAMS)]
    oracle = Recording(zip(ids, base), p=0.0, seed=3)
    spec = {"method": "ngram", "num_speculative_tokens": 3}
    with LLM(speculative_config=spec, proposer=oracle, **KW) as llm:
        c = llm.engine.counters

        def run(p):
            oracle.p, oracle.kept_prefix = p, 0
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
