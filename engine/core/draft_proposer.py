"""Draft-model proposals on the core's side (method draft_model, docs/SPECULATIVE.md
"Draft model"): which tokens the draft has seen per request, its block tables in its
own pool, and the batched forwards that catch it up and draft k tokens.

One call per step for all of the step's eligible requests. The draft first catches up
on every request's tokens it has not seen (the whole prompt the first time, then the
accepted tokens and the target's token; its argmax after the last is draft 1), then
draws one draft per further position (draft j fed back as the input of draft j + 1).
Catch-up is one extend where some request has more than DECODE_CATCH_UP unseen tokens,
else decode forwards (one token per request each). Greedy drafts: the verifier treats
them as one-hot q, exact for a deterministic drafter.

The draft's KV: the slots of the drafts fed back are kept where the target accepted
those very tokens (the next call compares), the rest is simply overwritten. No prefix
sharing: each request's draft blocks are its own, taken on its first proposal and given
back when it ends (`release`) or is found preempted (`sweep`). A request whose blocks do
not fit the draft pool gets no drafts (a plain decode): drafting never preempts.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from engine.request import RequestStatus
from engine.worker.draft_batch import DraftChain, DraftExtend

logger = logging.getLogger(__name__)

# unseen tokens per request up to which a proposal catches up by decode forwards (one
# token each) rather than one extend: after a verify a request has 1 or 2 (its accepted
# drafts that were fed back are kept), so steps take only decodes
DECODE_CATCH_UP = 2
# draft faults in a row after which speculation by the draft stops (the engine serves on)
MAX_CONSECUTIVE_FAULTS = 3


class DraftBlockPool:
    """A free list of the draft's KV blocks (no refcounts, no cache: nothing is shared)."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def take(self, n: int) -> list[int] | None:
        if n > len(self._free):
            return None
        taken = self._free[len(self._free) - n:]
        del self._free[len(self._free) - n:]
        return taken[::-1]

    def give(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))


@dataclass
class DraftState:
    """A request's place in the draft: its KV holds tokens [0, seen) of the request,
    then the drafts `fed` back at positions seen, seen + 1, ... (unverified)."""
    request: object
    blocks: list[int] = field(default_factory=list)
    seen: int = 0
    fed: list[int] = field(default_factory=list)

    def rewind(self, tokens: list[int]) -> None:
        """Keep the fed drafts that the target accepted (the same token at the same
        position has the same KV); at least the last token is always recomputed, its
        argmax being the first draft."""
        m, last, fed = 0, len(tokens) - 1, self.fed
        while m < len(fed) and self.seen + m < last and tokens[self.seen + m] == fed[m]:
            m += 1
        self.seen = min(self.seen + m, last)
        self.fed = []


class DraftProposer:
    """The Proposer of method draft_model (engine/core/spec_decode.py), over the
    executor's draft runner (engine/worker/draft_runner.py: its extend, decode_chain,
    max_model_len, block_size and num_blocks)."""
    method = "draft_model"

    def __init__(self, runner):
        self.runner = runner
        self.block_size = runner.block_size
        self.pool = DraftBlockPool(runner.num_blocks)
        self.states: dict[str, DraftState] = {}
        self.faults = 0                 # proposals whose draft forward raised
        self.consecutive_faults = 0
        self.disabled = False           # turned off after MAX_CONSECUTIVE_FAULTS

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_blocks - self.pool.num_free

    def release(self, request_id: str) -> None:
        state = self.states.pop(request_id, None)
        if state is not None:
            self.pool.give(state.blocks)

    def sweep(self) -> None:
        """Give back the blocks of requests no longer running (preempted: they recompute
        their draft KV too when they come back, like their target KV)."""
        for rid, state in list(self.states.items()):
            if state.request.status is not RequestStatus.RUNNING:
                self.release(rid)

    def propose(self, reqs: list, rooms: list[int]) -> list[list[int]]:
        """Up to rooms[i] greedy drafts for each request (fewer: none where its draft
        blocks do not fit, or past the draft's max length; none for anyone in a step
        whose draft forward fails, and none once the draft is turned off)."""
        self.sweep()
        drafts: list[list[int]] = [[] for _ in reqs]
        if self.disabled:
            return drafts
        ready = []       # (index, state, tokens, room)
        for i, (req, room) in enumerate(zip(reqs, rooms)):
            tokens = req.all_token_ids()
            room = min(room, self.runner.max_model_len - len(tokens) + 1)
            state = self.states.get(req.request_id)
            if state is None:
                state = self.states[req.request_id] = DraftState(req)
            state.rewind(tokens)
            if room > 0 and self._grow(state, len(tokens) + room - 1):
                ready.append((i, state, tokens, room))
        if not ready:
            return drafts
        try:
            self._draft(ready, drafts)
        except Exception as exc:     # noqa: BLE001 - a draft fault ends no request
            self._fault(exc)
            return [[] for _ in reqs]
        self.consecutive_faults = 0
        return drafts

    def _fault(self, exc: Exception) -> None:
        """This step decodes plainly; every request's draft KV is dropped (a forward
        may have stopped midway) and recomputed at its next proposal. Logged once;
        the draft is turned off after MAX_CONSECUTIVE_FAULTS in a row."""
        self.faults += 1
        self.consecutive_faults += 1
        for rid in list(self.states):
            self.release(rid)
        if self.faults == 1:
            logger.error("draft model forward failed; the step's requests decode without "
                         "drafts", exc_info=exc)
        if self.consecutive_faults >= MAX_CONSECUTIVE_FAULTS:
            self.disabled = True
            logger.error("draft model turned off after %d consecutive faults (%d in all)",
                         self.consecutive_faults, self.faults)

    def _draft(self, ready: list, drafts: list) -> None:
        """Catch up (an extend, or the chain's first positions), then the chain of
        decode positions: each row's drafts are its argmaxes from its last unseen
        token on."""
        if max(len(tokens) - state.seen for _, state, tokens, _ in ready) <= DECODE_CATCH_UP:
            given = [tokens[state.seen:] for _, state, tokens, _ in ready]
            starts = [state.seen for _, state, _, _ in ready]
        else:       # one extend: draft 1 of every row, given to the chain
            first = self.runner.extend(self._extend_columns(ready)).tolist()
            for (i, _, _, _), token in zip(ready, first):
                drafts[i].append(token)
            given = [[token] for token in first]
            starts = [len(tokens) for _, _, tokens, _ in ready]
        counts = [len(g) + room - 1 - len(drafts[i])
                  for g, (i, _, _, room) in zip(given, ready)]
        if max(counts):
            out = self.runner.decode_chain(self._chain(ready, given, starts, counts))
            for row, (i, _, _, _) in enumerate(ready):
                drafts[i].extend(out[row, len(given[row]) - 1:counts[row]].tolist())
        for i, state, tokens, _ in ready:
            state.seen, state.fed = len(tokens), drafts[i][:-1]

    def _grow(self, state: DraftState, slots: int) -> bool:
        need = -(-slots // self.block_size) - len(state.blocks)
        if need <= 0:
            return True
        taken = self.pool.take(need)
        if taken is None:
            return False
        state.blocks.extend(taken)
        return True

    def _slots(self, state: DraftState, positions: np.ndarray) -> np.ndarray:
        blocks, size = np.asarray(state.blocks, dtype=np.int64), self.block_size
        return blocks[positions // size] * size + positions % size

    @staticmethod
    def _tables(states: list[DraftState]) -> np.ndarray:
        table = np.zeros((len(states), max(len(s.blocks) for s in states)), dtype=np.int32)
        for row, s in enumerate(states):
            table[row, :len(s.blocks)] = s.blocks
        return table

    def _extend_columns(self, ready: list) -> DraftExtend:
        ids, pos, slots, lens = [], [], [], []
        for _, state, tokens, _ in ready:
            p = np.arange(state.seen, len(tokens), dtype=np.int64)
            ids.append(np.asarray(tokens[state.seen:], dtype=np.int64))
            pos.append(p)
            slots.append(self._slots(state, p))
            lens.append(p.shape[0])
        states = [r[1] for r in ready]
        return DraftExtend(
            input_ids=np.concatenate(ids), positions=np.concatenate(pos),
            slot_mapping=np.concatenate(slots),
            cu_seqlens_q=np.concatenate(([0], np.cumsum(lens))).astype(np.int32),
            context_lens=np.asarray([len(r[2]) for r in ready], dtype=np.int32),
            block_tables=self._tables(states))

    def _chain(self, ready: list, given: list[list[int]], starts: list[int],
               counts: list[int]) -> DraftChain:
        """Row r: counts[r] forwards from position starts[r], fed given[r] then its own
        argmaxes; then nothing (slot -1) to the chain's end."""
        n, rows = max(counts), len(ready)
        ids = np.zeros((n, rows), np.int64)
        feed = np.ones((n, rows), bool)
        pos = np.zeros((n, rows), np.int64)
        slots = np.full((n, rows), -1, np.int64)
        for r, ((_, state, _, _), g, start, count) in enumerate(zip(ready, given, starts,
                                                                      counts)):
            ids[:len(g), r], feed[:len(g), r] = g, False
            pos[:count, r] = np.arange(start, start + count)
            slots[:count, r] = self._slots(state, pos[:count, r])
            feed[count:, r] = False
        lens = np.where(slots >= 0, pos + 1, 1).astype(np.int32)
        return DraftChain(ids, feed, pos, slots, lens, self._tables([r[1] for r in ready]))

