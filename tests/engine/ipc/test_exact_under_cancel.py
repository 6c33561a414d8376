"""Exactness on the default path (the engine in its own process, async scheduling and the
prefix cache on: the defaults) through the public API only: groups of same-prompt
requests (dedup followers wait on a leader's logits; prefix hits), cancels of the first
of a group right after its submission (its prefill is often in flight when the cancel
lands) and of random others, live knob changes (token budget, max_num_seqs, prefix
caching, speculative k) between groups. Every request that finishes has exactly its solo
run's greedy tokens, a cancelled one a prefix of them, and none errs."""
import random
import threading

import pytest

from engine import SamplingParams
from engine.front.client import EngineClient

PROMPTS = ["ROMEO:\nWhat light through yonder window breaks?",
           "ROMEO:\nWhat light through yonder window",
           "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?",
           "First Citizen:\nBefore we proceed any further, hear me speak.",
           "KING HENRY:\nOnce more unto the breach, dear friends, once more;",
           "HAMLET:\nTo be, or not to be"]
MAX_TOKENS = 6
GROUPS = 160
TIMEOUT = 120


def greedy(n=MAX_TOKENS):
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def client():
    c = EngineClient(model="default", device="cpu", num_blocks=96, block_size=4,
                     max_num_batched_tokens=32, max_num_seqs=8,
                     speculative_config={"method": "ngram", "num_speculative_tokens": 2},
                     label="exact")
    yield c
    c.close()


@pytest.fixture(scope="module")
def solo(client):
    """Each prompt alone (the same engine, nothing else running)."""
    client.set_knobs(num_speculative_tokens=0)
    return {p: list(client.submit(p, greedy()).result(TIMEOUT).outputs[0].token_ids)
            for p in PROMPTS}


def run_group(client, rng, g, prompt, finished):
    """Identical prompts submitted together (the first leads, the others follow its
    logits), the leader cancelled at once: the engine, idle before, wakes on the first
    Submit and launches its prefill, so the cancel mostly lands while it is in flight."""
    ids = [f"g{g}-{i}" for i in range(rng.randint(2, 4))]
    ended = threading.Semaphore(0)

    def finish(event):
        finished[event.request_id] = (prompt, event.output)
        ended.release()
    streams = [client.submit(prompt, greedy(), request_id=rid, on_finish=finish) for rid in ids]
    client.cancel(ids[0])
    if rng.random() < 0.3:
        client.cancel(rng.choice(ids[1:]))
    for _ in streams:           # (kept until the end: a dropped stream cancels its request)
        assert ended.acquire(timeout=TIMEOUT), f"group {g} never ended"


def test_cancels_and_live_knobs_never_change_another_requests_tokens(client, solo):
    rng, finished = random.Random(7), {}
    for g in range(GROUPS):
        if g % 8 == 0:
            client.set_knobs(max_num_batched_tokens=rng.choice([16, 64]),
                             max_num_seqs=rng.choice([2, 4, 8]),
                             enable_prefix_caching=rng.random() < 0.8,
                             num_speculative_tokens=rng.choice([0, 0, 1, 3]))
        run_group(client, rng, g, rng.choice(PROMPTS), finished)
    wrong, errors, complete = [], [], 0
    for rid, (prompt, out) in finished.items():
        tokens, reason = list(out.outputs[0].token_ids), out.outputs[0].finish_reason
        if out.error is not None or reason == "error":
            errors.append((rid, out.error))
        elif tokens != solo[prompt][:len(tokens)] or reason == "length" and tokens != solo[prompt]:
            wrong.append((rid, tokens, solo[prompt]))
        complete += reason == "length"
    assert not errors, errors[:3]
    assert not wrong, f"{len(wrong)} of {len(finished)} changed: {wrong[:2]}"
    assert complete >= len(finished) // 3             # the check covered whole outputs
    assert client.wait_idle(TIMEOUT) and client.snapshot().num_used == 0
