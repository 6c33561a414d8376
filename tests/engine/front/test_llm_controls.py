"""LLM's controls (vLLM's offline API): reset_prefix_cache forgets the cached prefixes,
so the same prompt run again is computed again (no cache hit), and the tokens stay."""
from engine import LLM, SamplingParams

GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
PROMPT = "First Citizen:\nBefore we proceed any further, hear me speak."


def test_reset_prefix_cache_makes_the_next_run_cold():
    with LLM(model="default", device="cpu", num_blocks=64, block_size=4) as llm:
        first = llm.generate([PROMPT], GREEDY)[0]
        warm = llm.generate([PROMPT], GREEDY)[0]
        assert warm.metrics.num_cached_tokens > 0          # the prefix was cached
        assert llm.engine.pool.num_cached > 0
        llm.reset_prefix_cache()
        assert llm.engine.pool.num_cached == 0
        cold = llm.generate([PROMPT], GREEDY)[0]
        assert cold.metrics.num_cached_tokens == 0
        assert first.outputs[0].token_ids == warm.outputs[0].token_ids == cold.outputs[0].token_ids


def test_text_prompt_dict_is_the_text():
    """vLLM's TextPrompt, {"prompt": text}, is tokenized as the text itself (it was
    refused for lacking 'prompt_token_ids')."""
    with LLM(model="default", device="cpu") as llm:
        plain, as_dict = llm.generate([PROMPT, {"prompt": PROMPT}], GREEDY)
        assert as_dict.prompt == PROMPT and as_dict.prompt_token_ids == plain.prompt_token_ids
        assert as_dict.outputs[0].token_ids == plain.outputs[0].token_ids
