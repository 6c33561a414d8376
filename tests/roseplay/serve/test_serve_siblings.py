"""roseplay/serve/siblings.py on its own: a streamed echo + logprobs request with n > 1
shows choice 0's prompt logprobs on every sibling's first chunk, whatever order the
engine's events come in, and hands the big chunks on a few per turn of the loop."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

from engine.front.processor import StreamEvent
from roseplay.serve.siblings import HEAVY_PER_BATCH, SharedPromptLogprobs

LPS = (None, "lp1", "lp2")          # stands for a prompt's TokenLogprobs list


def ev(index: int, tokens=(1,), finished=False, lps=None, reason=None) -> StreamEvent:
    return StreamEvent(f"r-{index}", tuple(tokens), (0.0,) * len(tokens), "t" * len(tokens),
                       finished, reason, "boom" if reason == "error" else None, None, None, lps)


class FakeGeneration:
    """batches() yields the given batches; as in a Generation, every choice is done by
    the time the last batch is yielded."""

    def __init__(self, n: int, batches: list):
        self.choices = [SimpleNamespace(index=i) for i in range(n)]
        self._batches, self.done = batches, False

    async def batches(self):
        for i, batch in enumerate(self._batches):
            self.done = i == len(self._batches) - 1
            yield [(self.choices[int(e.request_id.split("-")[1])], e) for e in batch]


def collect(shared: SharedPromptLogprobs) -> list[list]:
    async def run():
        return [[(c.index, e) for c, e in batch] async for batch in shared.batches()]
    return asyncio.run(run())


def test_siblings_wait_for_choice_0_and_show_its_list_once():
    gen = FakeGeneration(3, [[ev(1), ev(2)],                        # before choice 0's
                             [ev(0, lps=LPS), ev(1, tokens=(2,))],
                             [ev(0, finished=True), ev(1, finished=True),
                              ev(2, finished=True)]])
    out = [item for batch in collect(SharedPromptLogprobs(gen, 3)) for item in batch]
    assert [i for i, _ in out] == [0, 1, 2, 1, 0, 1, 2]
    firsts = {}
    for i, e in out:
        firsts.setdefault(i, e)
    assert all(firsts[i].prompt_logprobs is LPS for i in range(3))
    assert sum(e.prompt_logprobs is not None for _, e in out) == 3     # first chunks only


def test_choice_0_failing_releases_its_siblings_without_the_list():
    gen = FakeGeneration(2, [[ev(1)], [ev(0, finished=True, reason="error")],
                             [ev(1, finished=True)]])
    out = [item for batch in collect(SharedPromptLogprobs(gen, 2)) for item in batch]
    assert [i for i, _ in out] == [0, 1, 1]
    assert all(e.prompt_logprobs is None for _, e in out)


def test_two_prompts_wait_each_for_their_own_choice_0():
    gen = FakeGeneration(4, [[ev(1), ev(3)], [ev(2, lps=LPS)], [ev(0, lps=LPS[:2])]])
    out = [item for batch in collect(SharedPromptLogprobs(gen, 2)) for item in batch]
    assert [i for i, _ in out] == [2, 3, 0, 1]
    assert dict(out)[3].prompt_logprobs is LPS and dict(out)[1].prompt_logprobs == LPS[:2]


def test_big_first_chunks_go_a_few_per_batch_and_done_waits_for_them():
    n = 3 * HEAVY_PER_BATCH + 2
    gen = FakeGeneration(n, [[ev(i) for i in range(1, n)],
                             [ev(0, lps=LPS, finished=True)]])
    shared = SharedPromptLogprobs(gen, n)

    async def run():
        sizes, done = [], []
        async for batch in shared.batches():
            sizes.append(sum(e.prompt_logprobs is not None for _, e in batch))
            done.append(shared.done)      # the SSE writer adds [DONE] once this is true
        return sizes, done
    sizes, done = asyncio.run(run())
    assert max(sizes) == HEAVY_PER_BATCH and sum(sizes) == n and len(sizes) > 3
    assert done == [False] * (len(done) - 1) + [True]
