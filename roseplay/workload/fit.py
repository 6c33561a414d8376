"""Does a scenario's workload fit the KV pool? The longest request of one cycle of its
items (prompt tokens + max_tokens) against num_blocks x block_size.

The engine refuses a request that can never fit the pool (engine/validation.py); a
workload whose every document is refused would serve nothing, forever. The CLI checks
before the app opens (token-id prompts: exact for models without a tokenizer, an
estimate for text), `start_live` again once the tokenizer is known (exact), and a live
scenario switch before it takes effect.
"""
from __future__ import annotations

import math

from roseplay.workload.items import make_spec
from roseplay.workload.scenarios import get_scenario, max_output_tokens

CYCLE = 64      # items that cover every scenario's pattern (mixed: 8 kinds x 8 documents)
LATER = 100_000     # and a few this far on: repeated questions carry a longer suffix
_cache: dict = {}


def prompt_tokens(prompt, tokenizer) -> int:
    """A WorkItem prompt's length in tokens, counted as the engine's front counts it."""
    if isinstance(prompt, dict):
        return len(prompt["prompt_token_ids"])
    return len(tokenizer.encode(prompt))


def longest_request(scenario: str, **workload) -> tuple[int, int, int]:
    """(tokens, prompt tokens, max_tokens) of the scenario's longest request: the longest
    prompt of a cycle of its items and the largest max_tokens it gives; `workload` as
    `make_spec` takes it (tokenizer, vocab_size, input_len, output_len, ...). Cached:
    a scenario switch asks again."""
    key = (scenario, id(workload.get("tokenizer")),
           tuple(sorted((k, v) for k, v in workload.items() if k != "tokenizer")))
    if key not in _cache:
        spec, make = make_spec(**workload), get_scenario(scenario).make
        indices = [*range(CYCLE), *range(LATER, LATER + 8)]
        prompt = max(prompt_tokens(make(spec, i).prompt, spec.tokenizer) for i in indices)
        out = max_output_tokens(scenario, spec.output_len, spec.range_ratio)
        _cache[key] = (prompt + out, prompt, out)
    return _cache[key]


def blocks_needed(tokens: int, block_size: int) -> int:
    """Blocks one request of `tokens` needs, + 1: a shared, partly filled last block's
    copy-on-write copy."""
    return math.ceil(tokens / block_size) + 1


def pool_problem(scenario: str, num_blocks: int, block_size: int, **workload) -> str | None:
    """Why the pool cannot serve the scenario (its longest request never fits), with the
    --num-blocks that can; None if it fits."""
    tokens, prompt, out = longest_request(scenario, **workload)
    need = blocks_needed(tokens, block_size)
    if num_blocks >= need:
        return None
    return (f"--num-blocks {num_blocks} holds {num_blocks * block_size} tokens; the longest "
            f"request of scenario {scenario} needs {tokens} ({prompt} prompt + {out} "
            f"max_tokens, from --input-len {workload.get('input_len')} --output-len "
            f"{workload.get('output_len')}): use --num-blocks {need} or more")
