"""One prompt-logprobs computation per prompt, however large n (completions `echo` with
`logprobs`).

The n choices of a prompt (best_of candidates included) are n engine requests with the
same prompt; only choice 0 asks the engine for the prompt's logprobs (prompts.py: the
others take the prefix cache and same-prompt dedup as usual), and every sibling shows
the same list. Before, each choice computed them itself: `n: 128` on a 1000-token
prompt was 128 prefills with an LM head over every position (~55 s of engine work on
the CPU instead of ~0.4 s).

Non-streamed, the response is built from every choice's final output at once
(`PromptLogprobs.keep`). Streamed, a sibling's first chunk carries the echoed prompt's
logprobs, so `SharedPromptLogprobs` holds its events until choice 0's arrive (or choice
0 ends without them: an error), then passes them on with the list attached.
"""
from __future__ import annotations

import asyncio
import dataclasses
from collections import deque

HEAVY_PER_BATCH = 4


class PromptLogprobs:
    """The prompt logprobs of a response's prompts, by prompt index."""

    def __init__(self, candidates: int):
        self.candidates = candidates      # engine requests per prompt (best_of, else n)
        self.by_prompt: dict[int, tuple] = {}

    def keep(self, choices) -> None:
        """Non-streamed: each prompt's list from its choice 0's output (before best_of
        picks and re-indexes the choices)."""
        for c in choices:
            lps = c.output.prompt_logprobs if c.output is not None else None
            if lps is not None:
                self.by_prompt[c.index // self.candidates] = lps

    def get(self, prompt: int) -> tuple | None:
        return self.by_prompt.get(prompt)


def _shows(event) -> bool:
    """Whether the SSE writer makes a chunk of `event` (streaming.coalesce)."""
    return event.finish_reason != "error" and bool(event.text or event.token_ids
                                                   or event.finished)


class SharedPromptLogprobs:
    """A streamed Generation (the `batches`, `done`, `close`, `abort` and `choices` the
    SSE response reads) whose choices 1..n-1 of a prompt show choice 0's prompt logprobs
    on their first chunk. Those chunks are large (the whole prompt's top-n each: 0.5 MB
    with logprobs 20 on a 1000-token prompt), so a batch carries at most
    HEAVY_PER_BATCH of them and the event loop takes a turn between batches."""

    def __init__(self, gen, n: int):
        self.gen, self.n = gen, n
        self.known: dict[int, tuple | None] = {}   # prompt -> choice 0's list (None: none)
        self.held: dict[int, list] = {}            # prompt -> (choice, event) waiting
        self.given: set[int] = set()               # siblings whose first chunk has it
        self.ready: deque = deque()                # (choice, event, heavy) to hand on

    @property
    def choices(self):
        return self.gen.choices

    @property
    def done(self) -> bool:
        return self.gen.done and not self.held and not self.ready

    def close(self) -> None:
        self.gen.close()

    def abort(self) -> None:
        self.gen.abort()

    async def batches(self):
        async for batch in self.gen.batches():
            for c, event in batch:
                self._sort(c, event)
            async for out in self._hand_on():
                yield out
        for waiting in self.held.values():    # choice 0 closed without an event (client gone)
            self.ready.extend(self._attach(*held) for held in waiting)
        self.held.clear()
        async for out in self._hand_on():
            yield out

    def _sort(self, c, event) -> None:
        prompt, rank = divmod(c.index, self.n)
        if rank == 0:
            lps = getattr(event, "prompt_logprobs", None)
            self.ready.append((c, event, lps is not None))      # its first chunk has them
            if prompt not in self.known and (lps is not None or event.finished):
                self.known[prompt] = lps
                self.ready.extend(self._attach(*held) for held in self.held.pop(prompt, ()))
        elif prompt in self.known:
            self.ready.append(self._attach(c, event))
        else:
            self.held.setdefault(prompt, []).append((c, event))

    async def _hand_on(self):
        """What is ready, in batches of at most HEAVY_PER_BATCH heavy chunks."""
        while self.ready:
            out, heavy = [], 0
            while self.ready and heavy < HEAVY_PER_BATCH:
                c, event, is_heavy = self.ready.popleft()
                out.append((c, event))
                heavy += is_heavy
            yield out
            if self.ready:
                await asyncio.sleep(0)       # /health and other streams between batches

    def _attach(self, c, event) -> tuple:
        """(c, event, heavy): the event with the prompt's logprobs if it makes c's first
        chunk (heavy: it carries them)."""
        lps = self.known.get(c.index // self.n)
        if lps is None or c.index in self.given or not _shows(event):
            return c, event, False
        self.given.add(c.index)
        return c, dataclasses.replace(event, prompt_logprobs=lps), True
