"""Our models, loaded through the real loader, give HF transformers' greedy tokens."""
import pytest
import torch

from engine import LLM, SamplingParams
from tests.hf_models import CONFIGS, make_checkpoint

PROMPT_LENS = [1, 3, 17, 40, 64, 129]   # 129 > several 16-token blocks
NEW_TOKENS = 32


def _prompts(vocab: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in PROMPT_LENS]


def _hf_greedy(model, prompt):
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                         min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0,
                         eos_token_id=None)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_greedy_tokens_match_hf(kind, tmp_path):
    hf = make_checkpoint(kind, tmp_path)
    vocab = hf.config.vocab_size
    prompts = _prompts(vocab)
    expected = [_hf_greedy(hf, p) for p in prompts]
    llm = LLM(model=str(tmp_path), device="cpu", dtype="float32", block_size=16,
              max_num_batched_tokens=64, num_blocks=128, check_invariants=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True))
    got = [list(o.outputs[0].token_ids) for o in outs]
    for p, e, g in zip(prompts, expected, got):
        assert g == e, f"prompt of {len(p)} tokens diverged"
