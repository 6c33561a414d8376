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

from dataclasses import dataclass, field

import numpy as np

from engine.request import RequestStatus
from engine.worker.draft_runner import DraftDecode, DraftExtend, DraftRunner, build_draft_runner

# unseen tokens per request up to which a proposal catches up by decode forwards (one
# token each) rather than one extend: after a verify a request has 1 or 2 (its accepted
# drafts that were fed back are kept), so steps take only decodes
DECODE_CATCH_UP = 2


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
    def __init__(self, runner: DraftRunner):
        self.runner = runner
        self.block_size = runner.block_size
        self.pool = DraftBlockPool(runner.num_blocks)
        self.states: dict[str, DraftState] = {}

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
        blocks do not fit, or past the draft's max length)."""
        self.sweep()
        drafts: list[list[int]] = [[] for _ in reqs]
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
        if max(len(tokens) - state.seen for _, state, tokens, _ in ready) <= DECODE_CATCH_UP:
            self._decode_only(ready, drafts)
        else:
            self._extend_then_decode(ready, drafts)
        return drafts

    def _extend_then_decode(self, ready: list, drafts: list) -> None:
        """One extend of every request's unseen tokens (draft 1), then a decode per
        further draft position."""
        first = self.runner.extend(self._extend_columns(ready))
        for (i, state, tokens, _), token in zip(ready, first.tolist()):
            state.seen = len(tokens)
            drafts[i].append(token)
        for j in range(1, max(room for *_, room in ready)):
            active = [r for r in ready if r[3] > j]
            pos = [len(tokens) + j - 1 for _, _, tokens, _ in active]
            ids = [drafts[i][-1] for i, *_ in active]
            out = self.runner.decode(self._decode_columns([r[1] for r in active], pos, ids))
            for (i, state, _, _), token in zip(active, out.tolist()):
                state.fed.append(drafts[i][-1])
                drafts[i].append(token)

    def _decode_only(self, ready: list, drafts: list) -> None:
        """Decode forwards only (the usual case after a verify: one or two unseen
        tokens): forward f feeds each request its next unseen token, then its own
        drafts; the output after its last unseen token is draft 1. A decode forward
        costs a fraction of an extend's (one fused C layer on the CPU, fewer launches
        on the GPU)."""
        starts = [state.seen for _, state, _, _ in ready]
        counts = [len(tokens) - seen + room - 1
                  for (_, _, tokens, room), seen in zip(ready, starts)]
        for f in range(max(counts)):
            active = [(r, seen + f) for r, seen, n in zip(ready, starts, counts) if f < n]
            ids = [tokens[p] if p < len(tokens) else drafts[i][-1]
                   for (i, _, tokens, _), p in active]
            out = self.runner.decode(self._decode_columns(
                [r[1] for r, _ in active], [p for _, p in active], ids))
            for ((i, state, tokens, _), p), fed, token in zip(active, ids, out.tolist()):
                if p >= len(tokens):
                    state.fed.append(fed)
                if p >= len(tokens) - 1:
                    drafts[i].append(token)
        for _, state, tokens, _ in ready:
            state.seen = len(tokens)

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

    def _decode_columns(self, states: list[DraftState], positions: list[int],
                        ids: list[int]) -> DraftDecode:
        """One token per request: ids[n] at positions[n] of states[n]."""
        pos = np.asarray(positions, dtype=np.int64)
        return DraftDecode(
            input_ids=np.asarray(ids, dtype=np.int64), positions=pos,
            slot_mapping=np.concatenate([self._slots(s, pos[n:n + 1])
                                         for n, s in enumerate(states)]),
            context_lens=(pos + 1).astype(np.int32), block_tables=self._tables(states))

def make_draft_proposer(config, target_vocab: int, ops, device, dtype, num_blocks: int,
                        max_model_len: int) -> DraftProposer | None:
    """The draft model and its pool for method draft_model (else None). Its pool holds
    what the running requests can use (max_num_seqs full-length requests: only running
    requests hold draft blocks when a proposal takes more), at most the target's block
    count: on CPU the two are alike, on CUDA the target's count comes from the GPU's
    memory and is far more than a draft needs."""
    spec = config.speculative_config
    if spec is None or spec.method != "draft_model":
        return None
    per_seq = -(-max_model_len // config.block_size)
    blocks = min(num_blocks, config.scheduler.max_num_seqs * per_seq)
    runner = build_draft_runner(spec.model, target_vocab, ops, device, dtype, blocks,
                                config.block_size, config.seed)
    return DraftProposer(runner)
