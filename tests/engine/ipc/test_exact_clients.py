"""Several clients of one engine process (the owner and two attached), each on its own
thread: greedy and seeded requests with logprobs, prompt logprobs, penalties and
grammars, while each client cancels some, flips knobs (budget, prefix caching,
speculative k), clears the cache, and pauses, single-steps and resumes the shared
engine. Every request gets its solo run's tokens and logprobs (a cancelled one a prefix),
through each client's share of every step (output_split: tokens, logprobs and prompt
logprobs of three owners in one step); no step_once waits for ever; after it all no
block, host block or live request is left."""
from __future__ import annotations

import random
import threading

import pytest

from engine import SamplingParams
from engine.codes import CANCELLED, ERROR, FINISHED
from engine.commands import ResetPrefixCache
from engine.front.client import EngineClient

pytestmark = pytest.mark.timeout(300)
GRAMMARS = [{"regex": "[a-d]{1,3}(,[0-9]{1,2}){0,3}"}, {"choice": ["yes", "no", "maybe so"]}]
PROMPTS = ["ROMEO.\nWho art thou?\n\nJULIET.\n", "KING HENRY.\nSpeak, what news?\n\n",
           "HAMLET.\nTo be, or not to be, that is", "First Citizen:\nBefore we proceed",
           "ROMEO.\nWho art thou?\n\n"]
CLIENTS, REQUESTS = 3, 25


def draw(rng: random.Random) -> SamplingParams:
    """Seeded ones ask logprobs: not speculated, so exact under speculation too."""
    kw = dict(max_tokens=rng.randint(1, 24), ignore_eos=rng.random() < 0.5, temperature=0)
    if rng.random() < 0.5:
        kw.update(temperature=1.0, seed=rng.randrange(2 ** 31), logprobs=2)
    if rng.random() < 0.3:
        kw.update(logprobs=rng.choice([0, 3]))
    if rng.random() < 0.2:
        kw.update(presence_penalty=0.5)
    if rng.random() < 0.25:
        kw.update(structured_outputs=rng.choice(GRAMMARS))
    if rng.random() < 0.1:
        kw.update(prompt_logprobs=1)
    return SamplingParams(**kw)


def meddle(client: EngineClient, plan: list, rng: random.Random) -> list:
    streams = []
    for prompt, params, act in plan:
        stream = client.submit(prompt, params)
        if act < 0.1:
            stream.cancel()
        elif act < 0.2:
            client.set_knobs(max_num_batched_tokens=rng.choice([3, 8, 64]),
                             enable_prefix_caching=rng.random() < 0.7,
                             num_speculative_tokens=rng.choice([0, 1, 2]))
        elif act < 0.25:
            client.send_command(ResetPrefixCache())
        elif act < 0.3:
            client.pause()
            for _ in range(2):
                assert client.step_once().wait(60), "a single step was never answered"
            client.resume()
        streams.append(stream)
    return [s.result(timeout=120) for s in streams]


def same(got, want) -> bool:
    g, w = got.outputs[0], want.outputs[0]
    n = len(g.token_ids)
    if g.finish_reason == "cancelled":
        return g.token_ids == w.token_ids[:n]
    if (g.token_ids, g.finish_reason) != (w.token_ids, w.finish_reason):
        return False
    if (got.prompt_logprobs is None) != (want.prompt_logprobs is None):
        return False
    return all(a.token_ids[0] == b.token_ids[0] and abs(a.logprobs[0] - b.logprobs[0]) < 1e-3
               for a, b in zip(g.logprobs or (), w.logprobs or ()))


@pytest.mark.parametrize("seed", range(2))
def test_clients_sharing_an_engine_get_their_solo_outputs(seed):
    with EngineClient(model="default", device="cpu", num_blocks=48, block_size=8,
                      max_num_batched_tokens=16, max_num_seqs=6, kv_offloading_size=0.005,
                      speculative_config={"method": "ngram", "num_speculative_tokens": 2},
                      label="owner") as owner:
        rngs = [random.Random(seed * CLIENTS + c) for c in range(CLIENTS)]
        plans = [[(rng.choice(PROMPTS), draw(rng), rng.random()) for _ in range(REQUESTS)]
                 for rng in rngs]
        alone = [[owner.submit(p, sp).result(timeout=120) for p, sp, _ in plan]
                 for plan in plans]
        clients = [owner] + [EngineClient(connect=owner.address, label=f"c{c}")
                             for c in range(1, CLIENTS)]
        results, errors = [None] * CLIENTS, []

        def run(c: int) -> None:
            try:
                results[c] = meddle(clients[c], plans[c], random.Random(c))
            except BaseException as exc:     # (a thread's exception would go unseen)
                errors.append(exc)
        threads = [threading.Thread(target=run, args=(c,)) for c in range(CLIENTS)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join(240)
        finally:
            for c in clients[1:]:
                c.close()
        assert not errors, errors
        for c in range(CLIENTS):
            for got, want, (_, params, _) in zip(results[c], alone[c], plans[c]):
                assert same(got, want), (params, got.outputs[0], want.outputs[0])
        owner.send_command(ResetPrefixCache())
        assert owner.wait_idle(60)
        snap = owner.snapshot()
        assert snap.num_used == 0 and not snap.host_block_refcount.any()
        assert all(r.state in (FINISHED, CANCELLED, ERROR) for r in snap.requests)
