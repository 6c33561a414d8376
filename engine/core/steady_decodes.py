"""The steady decode step as arrays kept across steps (vLLM's persistent batch, for the
scheduler and the batch builder).

A plan that decodes every running request, in the running order (less those its
pending tokens end by length), keeps its decodes' columns: the requests, their
positions, block-table rows and length caps (`DecodeColumns`). When that plan is
committed with each decode's next token pending (async scheduling: commit_plan tells
the scheduler) and the running requests are still the same objects in the same order,
every one of them decodes again, one position further, its token pending: the next
plan's partition is array arithmetic on the kept columns (`advance`) instead of a pass
over the requests, and the batch builder takes the decode rows' positions, table rows
and token rows from the plan (StepPlan.decode_columns) instead of reading each request.

What the columns step on through:
- requests whose pending token ends them by length: left out of the next plan and its
  columns, which then read their pending tokens from the kept rows of the step in
  flight (`fed_rows`), so W1's finishing steps keep their columns;
- requests that end by a stop token or a cancel: their rows in the step in flight
  (launched before they ended) are void; the commit tells the scheduler which
  (`gone`), and the next plan leaves them out the same way;
- prompts the plan finished (requests admitted in it, each chunk to its last token):
  the commit counts their first tokens as pending and hands their sample rows over
  (`joined`); they decode next, appended to the columns and fed from those rows. So a
  closed loop, where requests end and join every step, keeps its columns, and a step's
  decode rows are read by `append_steady` while its columns lead the running requests
  (the core's token emission; its prompts' rows the general way).

Anything else (a prompt's chunk that stops short of its end, a preemption, a verify, a
dedup follower, a step read before the next was planned, another order) leaves no
columns, and so does a step of fewer than MIN_DECODES decodes: the next plan is made
the general way. check_invariants compares the kept columns with the requests (`check`).
"""
from __future__ import annotations

from itertools import repeat

import numpy as np

from engine.codes import REASON_LENGTH, REASON_STOP
from engine.core.kv.block_tables import BlockTables
from engine.request import Request

# the fewest decodes a step keeps columns for: narrower, the pass over the requests
# costs less than the arrays' fixed cost (2026-11-28, host_step_profile's loop: at 1 to
# 32 decodes the columns cost 0-16 µs a step more, at 64 they save ~20 µs)
MIN_DECODES = 64


class DecodeColumns:
    """The decodes of a plan: `requests` (the running order), each one's position in
    it (`positions`, int64), KV table row, Request.length_cap, Request.admit_seq and id,
    whether every one samples greedily without processing (Request.plain_greedy), and
    the sample rows of the step before that feed their pending tokens (`fed_rows`,
    int64; None: row i feeds decode i).
    It holds no reference to its plan (the plan holds it: StepPlan.decode_columns), so
    a plan and its 256 chunks are freed when the step ends, not by the garbage
    collector (a cycle each step set off a young collection every ~3 decode steps)."""
    __slots__ = ("requests", "positions", "table_rows", "caps", "admits", "ids", "greedy",
                 "fed_rows")

    def __init__(self, requests: list[Request], positions: np.ndarray,
                 table_rows: np.ndarray, caps: np.ndarray, admits: tuple[int, ...],
                 ids: tuple[str, ...], greedy: bool, fed_rows: np.ndarray | None = None):
        self.requests, self.positions = requests, positions
        self.table_rows, self.caps, self.admits, self.ids = table_rows, caps, admits, ids
        self.greedy, self.fed_rows = greedy, fed_rows

    @classmethod
    def of(cls, plan, order: list[Request]) -> "DecodeColumns | None":
        """The columns of a plan that decodes `order` (else None), read from the
        requests once: the step that enters the steady state. Left out of the plan may
        be only requests whose pending token ends them by length (they finish when it
        is read: a closed loop has some every step); its prefill chunks, if any, are of
        requests admitted in it. Every decode's last token is pending from the step in
        flight, so they all come with one step's tokens (append_steady's one gap)."""
        decodes = plan.decodes
        if plan.verifies or plan.preempted or len(decodes) > len(order):
            return None
        reqs = [c.request for c in decodes]
        if (reqs != order and not _only_ending_left_out(reqs, order)) \
                or not all([r.pending_row >= 0 for r in reqs]):
            return None
        return cls(reqs, np.array([c.start for c in decodes], np.int64),
                   np.array([r.table_row for r in reqs], np.int64),
                   np.array([r.length_cap for r in reqs], np.int64),
                   tuple([r.admit_seq for r in reqs]), tuple([r.request_id for r in reqs]),
                   all(r.plain_greedy for r in reqs))

    def live(self, gone: list[int], joined: list) -> list[Request]:
        """The requests less the rows `gone` (ended since the plan's launch), then those
        whose prompts the plan finished (`joined`: (row, request))."""
        if not gone and not joined:
            return self.requests
        out = list(self.requests)
        for row in reversed(gone):
            del out[row]
        return out + [r for _, r in joined]

    def advance(self, page: int, tables: BlockTables, refcounts: np.ndarray,
                gone: list[int] = (), joined: list = ()
                ) -> tuple[list[Request], list[bool] | None, "DecodeColumns | None"]:
        """The next step's decodes after this plan's commit (each request one position
        further, its token pending; then the requests whose prompts the plan finished,
        `joined`: (sample row, request), at their first output position), whether each
        needs no KV work (its slot in a block it owns alone; None: every one), and their
        columns (None: no decode left). Left out: the rows `gone` (requests that ended
        since the launch: a stop token, a cancel) and a request whose pending token ends
        it by length (its token count, position + 1, reaches its cap), as the
        scheduler's classify leaves it out."""
        reqs, pos, rows, caps = self.requests, self.positions + 1, self.table_rows, self.caps
        admits, ids, greedy, fed = self.admits, self.ids, self.greedy, None
        ended = pos + 1 >= caps
        if gone:
            ended[gone] = True
        if joined:
            new = [r for _, r in joined]
            new_pos = np.array([r.num_computed_tokens for r in new], np.int64)
            new_caps = np.array([r.length_cap for r in new], np.int64)
            fed = np.concatenate((np.arange(len(reqs), dtype=np.int64),
                                  np.array([row for row, _ in joined], np.int64)))
            reqs, pos, caps = reqs + new, np.concatenate((pos, new_pos)), \
                np.concatenate((caps, new_caps))
            rows = np.concatenate((rows, np.array([r.table_row for r in new], np.int64)))
            ended = np.concatenate((ended, new_pos + 1 >= new_caps))
            admits = admits + tuple([r.admit_seq for r in new])
            ids = ids + tuple([r.request_id for r in new])
            greedy = greedy and all(r.plain_greedy for r in new)
        if not ended.any():
            return list(reqs), self._fast(pos, rows, page, tables, refcounts), \
                DecodeColumns(reqs, pos, rows, caps, admits, ids, greedy, fed)
        keep = np.flatnonzero(~ended)
        if not keep.size:
            return [], None, None
        kept = keep.tolist()
        reqs = [reqs[i] for i in kept]
        rows = rows[keep]    # (a gone row's table may be another's by now)
        greedy = greedy or all(r.plain_greedy for r in reqs)   # the others may have ended
        return reqs, self._fast(pos[keep], rows, page, tables, refcounts), DecodeColumns(
            reqs, pos[keep], rows, caps[keep], tuple([admits[i] for i in kept]),
            tuple([ids[i] for i in kept]), greedy, keep if fed is None else fed[keep])

    @staticmethod
    def _fast(pos: np.ndarray, rows: np.ndarray, page: int, tables: BlockTables,
              refcounts: np.ndarray) -> list[bool] | None:
        """Whether each decode's slot lies in a block its request owns alone (None:
        every one's does)."""
        block = pos // page
        inside = block < tables.lengths[rows]
        ids = tables.matrix[rows, np.minimum(block, tables.matrix.shape[1] - 1)]
        fast = inside & (refcounts[ids] == 1)
        return None if fast.all() else fast.tolist()

    def check(self) -> None:
        """Assert the kept columns match the requests (check_invariants)."""
        reqs = self.requests
        # each request's computed tokens: its position, or one more once committed
        ahead = np.array([r.num_computed_tokens for r in reqs], np.int64) - self.positions
        assert not len(reqs) or (ahead.min() == ahead.max() and ahead[0] in (0, 1)), \
            "steady decode positions out of step"
        assert self.table_rows.tolist() == [r.table_row for r in reqs], \
            "steady decode table rows out of step"
        assert self.caps.tolist() == [r.length_cap for r in reqs], \
            "steady decode length caps out of step"
        assert list(self.ids) == [r.request_id for r in reqs], "steady decode ids out of step"
        assert list(self.admits) == [r.admit_seq for r in reqs] and \
            self.greedy == all(r.plain_greedy for r in reqs), "steady decode admissions out of step"


def _only_ending_left_out(reqs: list[Request], order: list[Request]) -> bool:
    """`reqs` is `order` less requests whose pending token ends them by length (the
    scheduler's classify leaves those out)."""
    it = iter(reqs)
    want = next(it, None)
    for r in order:
        if r is want:
            want = next(it, None)
        elif r.pending_row < 0 or r.num_tokens < r.length_cap:
            return False
    return want is None


def append_steady(cols: DecodeColumns, tokens: list[int], now: float, itls,
                  request_ids: list[str], token_ids: list[int]) -> list[tuple[Request, str]]:
    """engine/request.py append_sampled for the rows of a steady decode step whose kept
    columns step on from the last plan's, all of them still running (the scheduler's
    `steady_rows`): each row resolves its pending token; every row's last token came
    with the last step's tokens, so its inter-token gap is the same; a request's token
    count is its position + 2 (the token before and this one), so the length cap is
    checked on the columns. Returns the requests a token ends, in row order."""
    requests = cols.requests
    gap = now - requests[0].token_times[-1]
    stops = []
    for i, (req, token) in enumerate(zip(requests, tokens)):
        req.output_token_ids[-1] = token
        req.pending_row = -1
        req.token_times.append(now)
        if token in req.stop_ids:
            stops.append(i)
    itls.extend(repeat((now, gap), len(requests)))
    request_ids.extend(cols.ids)
    token_ids.extend(tokens)
    longs = np.flatnonzero(cols.positions + 2 >= cols.caps).tolist()
    if not stops and not longs:
        return []
    stopped = set(stops)
    return [(requests[i], REASON_STOP if i in stopped else REASON_LENGTH)
            for i in sorted(stopped.union(longs))]
