"""Builds the StepBatch of a scheduler plan: the one place where requests become arrays.

Vectorized where the batch is wide (decode positions and slots are numpy operations,
block tables rows of the KV manager's BlockTables); per-chunk Python only for prefill
token ids. Speculative decoding's verified positions are decode rows (docs/SPECULATIVE.md
"One step"): a verify-only step is a decode step, through the decode kernels and graphs.
"""
from __future__ import annotations

import dataclasses
from itertools import chain, repeat
from operator import attrgetter

import numpy as np

from engine.core.kv.block_tables import BlockTables
from engine.core.prompt_logprobs import prompt_rows
from engine.core.sampling_extras import sampling_extras
from engine.core.step_plan import StepPlan
from engine.ranges import seed_bits
from engine.worker.step_batch import SamplingColumns, StepBatch

_EMPTY_I32 = np.zeros((0,), dtype=np.int32)
_EMPTY_I64 = np.zeros((0,), dtype=np.int64)
_NO_TABLES = np.zeros((0, 1), dtype=np.int32)
_NO_PREFILLS = dict(prefill_block_tables=_NO_TABLES, prefill_cu_seqlens_q=np.zeros(1, np.int32),
                    prefill_context_lens=_EMPTY_I32, prefill_max_seqlen_q=0)


_GREEDY_COLUMNS: dict[int, SamplingColumns] = {}   # by row count: the common case, built once
_is_plain_greedy = attrgetter("plain_greedy")
_is_argmax_row = attrgetter("argmax_row")


def _greedy_columns(n: int) -> SamplingColumns:
    """Columns of n greedy rows (read-only, shared by every all-greedy step of n rows; no
    request ids: only seeded random rows need theirs)."""
    cols = _GREEDY_COLUMNS.get(n)
    if cols is None:
        arrays = (np.ones(n, bool), np.ones(n, np.float32), np.zeros(n, np.int64),
                  np.ones(n, np.float32), np.zeros(n, bool), np.zeros(n, np.uint64))
        for a in arrays:
            a.flags.writeable = False
        cols = _GREEDY_COLUMNS[n] = SamplingColumns((), True, *arrays)
    return cols


def _sampling_columns(requests: list) -> SamplingColumns:
    if all(map(_is_plain_greedy, requests)):
        return _greedy_columns(len(requests))
    params = [r.params for r in requests]
    if all(map(_is_argmax_row, requests)):    # greedy, some asking logprobs: the shared
        return dataclasses.replace(_greedy_columns(len(requests)),    # greedy columns
                                   extras=sampling_extras(requests, params))
    greedy = np.fromiter((p.greedy for p in params), dtype=bool, count=len(params))
    temps = np.fromiter((p.temperature if not p.greedy else 1.0 for p in params), np.float32)
    return SamplingColumns(
        tuple(r.request_id for r in requests), bool(greedy.all()), greedy, temps,
        np.fromiter((p.top_k for p in params), np.int64, count=len(params)),
        np.fromiter((p.top_p for p in params), np.float32, count=len(params)),
        np.fromiter((p.seed is not None for p in params), bool, count=len(params)),
        np.fromiter((seed_bits(p.seed or 0) for p in params), np.uint64, count=len(params)),
        sampling_extras(requests, params))


def _sample_rows(requests: list, followers: dict, first: int = 0) -> tuple[list[int], list]:
    """Logits rows first, first + 1, ... sample `requests` in order, each row repeated for
    the dedup followers of its request."""
    if not followers:
        return list(range(first, first + len(requests))), list(requests)
    rows, out = [], []
    for i, r in enumerate(requests, first):
        rows.append(i)
        out.append(r)
        for f in followers.get(r, ()):
            rows.append(i)
            out.append(f)
    return rows, out


def _kept_columns(cols, device_fed: bool):
    """_decode_columns' result from a steady decode plan's kept columns (StepPlan.
    decode_columns, engine/core/steady_decodes.py), read from no request: decode i's
    token is pending in sample row i of the step in flight, or in row fed_rows[i] where
    the columns left rows out (ascending: in order only if the rows left out were the
    last). None: not such a plan."""
    if cols is None or not device_fed:
        return None
    n = len(cols.requests)
    lens = cols.positions.astype(np.int32)
    lens += 1
    fed = cols.fed_rows
    if fed is None:
        fed = np.arange(n, dtype=np.int64)
    return list(cols.requests), cols.table_rows, cols.positions, lens, [0] * n, fed, \
        cols.fed_rows is None or int(fed[-1]) == n - 1


def _decode_columns(decodes: list, device_fed: bool):
    """One pass over the decodes (the wide part of a step): their requests, table rows,
    positions, context lengths and (async scheduling) the previous step's sample row
    that feeds each decode whose token is still pending on the device (None: none is);
    then their host input ids (PENDING_TOKEN ones as 0: the device feeds those), all 0
    when the device feeds every one (a steady async decode step)."""
    if not decodes:           # (a verify-only step: batch 1's with drafts)
        return [], _EMPTY_I64, _EMPTY_I64, _EMPTY_I32, [], None, False
    reqs, rows, pos, fed = [], [], [], []
    for c in decodes:
        r = c.request
        reqs.append(r)
        rows.append(r.table_row)
        pos.append(c.start)
        fed.append(r.pending_row)
    positions = np.array(pos, dtype=np.int64)
    lens = np.array(pos, dtype=np.int32)
    lens += 1
    token_rows = None
    if device_fed and reqs and max(fed) >= 0:
        token_rows = np.array(fed, dtype=np.int64)
        if min(fed) >= 0:
            return reqs, np.array(rows, dtype=np.int64), positions, lens, [0] * len(reqs), \
                token_rows, fed == list(range(len(fed)))
    ids = [max((r.output_token_ids or r.prompt_token_ids)[-1], 0) for r in reqs]
    return reqs, np.array(rows, dtype=np.int64), positions, lens, ids, token_rows, False


def _prefill_columns(prefills: list, ids: list, tables: BlockTables, block_size: int,
                     d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list, dict]:
    """The prefill chunks' columns (their token ids appended to `ids`): positions and
    slots (every chunk's, one array each: W1's first step has 16 chunks of 512), the
    logits rows of the chunks that sample, those chunks, and the StepBatch's prefill
    fields."""
    lens = [c.num_tokens for c in prefills]
    for c in prefills:
        ids.extend(c.request.token_slice(c.start, c.start + c.num_tokens))
    n = np.asarray(lens, dtype=np.int64)
    cum = np.cumsum(n)
    # a token's position: its chunk's start plus its offset in the chunk
    starts = np.fromiter((c.start for c in prefills), np.int64, len(prefills))
    positions = np.arange(int(cum[-1]), dtype=np.int64) + np.repeat(starts - cum + n, n)
    rows = np.repeat(np.fromiter((c.request.table_row for c in prefills), np.int64,
                                 len(prefills)), n)
    block, offset = np.divmod(positions, block_size)
    slots = tables.matrix[rows, block] * block_size + offset
    ends = d - 1 + cum                   # a chunk's last token: its logits row
    sampled = [c for c in prefills if c.sample]
    if len(sampled) < len(prefills):
        ends = ends[[c.sample for c in prefills]]
    fields = dict(
        prefill_block_tables=tables.gather([c.request for c in prefills]),
        prefill_cu_seqlens_q=np.concatenate(([0], cum)).astype(np.int32),
        prefill_context_lens=np.asarray([c.start + c.num_tokens for c in prefills], np.int32),
        prefill_max_seqlen_q=max(lens))
    return positions, slots, ends, sampled, fields


def _verify_columns(verifies: list) -> tuple:
    """Speculative decoding: every verified position (the request's last token, then each
    draft) is a decode row of its own: its request's table row, its position, context
    length position + 1 (so row j attends to the rows before it, whose K/V the layer
    stores first), in position order. Returns (requests, table rows, positions, input
    ids, the draft each row checks: -1 for the bonus row, where row j checks the draft
    fed as row j + 1's input). One pass for the ids; a lone request's rows (batch 1)
    without the repeat and cumsum that many requests' take (a third of the cost there)."""
    ids, drafts, table_rows, starts, counts = [], [], [], [], []
    for c in verifies:
        req, start, draft = c.request, c.start, c.draft
        ids += req.token_slice(start, start + 1)
        ids += draft
        drafts += draft
        drafts.append(-1)
        table_rows.append(req.table_row)
        starts.append(start)
        counts.append(len(draft) + 1)
    reqs = list(chain.from_iterable(repeat(c.request, c.num_tokens) for c in verifies))
    drafts = np.array(drafts, np.int64)
    if len(counts) == 1:
        start, n = starts[0], counts[0]
        return reqs, np.full(n, table_rows[0], np.int64), \
            np.arange(start, start + n, dtype=np.int64), ids, drafts
    counts = np.array(counts, np.int64)
    ends = np.cumsum(counts)
    positions = np.arange(ends[-1], dtype=np.int64) + \
        np.repeat(np.array(starts, np.int64) - ends + counts, counts)
    return reqs, np.repeat(np.array(table_rows, np.int64), counts), positions, ids, drafts


def _with_verify_rows(columns: tuple, verifies: list) -> tuple:
    """_decode_columns' result with the verify rows appended as more decodes (their
    input ids from the host: a verified request has no token pending on the device)."""
    reqs, rows, pos, lens, ids, token_rows, _ = columns
    v_reqs, v_rows, v_pos, v_ids, draft_ids = _verify_columns(verifies)
    v_lens = (v_pos + 1).astype(np.int32)
    if not reqs:              # a verify-only step (batch 1's): nothing to join
        return (v_reqs, v_rows, v_pos, v_lens, v_ids, None, False), draft_ids
    if token_rows is not None:
        token_rows = np.concatenate((token_rows, np.full(len(v_reqs), -1, np.int64)))
    return (reqs + v_reqs, np.concatenate((rows, v_rows)), np.concatenate((pos, v_pos)),
            np.concatenate((lens, v_lens)), list(ids) + v_ids, token_rows, False), draft_ids


def _with_prompt_rows(logits_indices: np.ndarray, plan: StepPlan, d: int) -> tuple:
    """prompt_logprobs (engine/core/prompt_logprobs.py): every position of the chunks
    of requests that ask, as logits rows after the step's others (no row otherwise);
    the plan keeps them (plan.prompt_rows) for the step's copy to the host."""
    rows = plan.prompt_rows = prompt_rows(plan.prefills, d)
    if rows is None:
        return logits_indices, {}
    token_rows = np.concatenate(rows.token_rows)
    base = logits_indices.shape[0]
    return np.concatenate((logits_indices, token_rows)), dict(
        prompt_logprob_rows=np.arange(base, base + token_rows.shape[0], dtype=np.int64),
        prompt_logprob_targets=np.asarray(rows.targets, dtype=np.int64),
        num_prompt_logprobs=rows.num_logprobs)


def build_step_batch(plan: StepPlan, followers: dict, block_size: int, tables: BlockTables,
                     device_fed: bool = False) -> tuple[StepBatch, list]:
    """The plan as a StepBatch, and the requests of its sample rows (in row order).

    `followers` maps a dedup leader to the requests that sample from its logits row.
    `tables`: the KV manager's BlockTables (every request's table as a matrix row).
    `device_fed` (async scheduling): the decodes whose tokens are pending take them from
    their sample rows (Request.pending_row) of the step still in flight."""
    decodes, prefills, verifies = plan.decodes, plan.prefills, plan.verifies
    columns = _kept_columns(plan.decode_columns, device_fed)
    kept_greedy = columns is not None and plan.decode_columns.greedy   # (no verifies)
    columns = columns or _decode_columns(decodes, device_fed)
    draft_ids = None
    if verifies:              # decode rows after the plain decodes (_verify_columns)
        columns, draft_ids = _with_verify_rows(columns, verifies)
    dec_reqs, dec_rows, dec_pos, dec_lens, ids, token_rows, fed_in_order = columns
    d = len(dec_reqs)
    if d:
        dec_tables = tables.gather_rows(dec_rows)
        block, offset = np.divmod(dec_pos, block_size)
        dec_slots = tables.matrix[dec_rows, block] * block_size + offset   # int64
    else:
        dec_tables, dec_slots = _NO_TABLES, _EMPTY_I64
    # sample rows: every decode row, every prefill chunk that reaches the end of its tokens
    dec_ends = np.arange(d, dtype=np.int64)
    if prefills:
        positions, slots, ends, sampled, prefill = _prefill_columns(
            prefills, ids, tables, block_size, d)
        if d:
            positions = np.concatenate((dec_pos, positions))
            slots = np.concatenate((dec_slots, slots))
        logits_indices = np.concatenate((dec_ends, ends))
    else:
        positions, slots, logits_indices, sampled, prefill = \
            dec_pos, dec_slots, dec_ends, [], _NO_PREFILLS
    draft_rows = None
    if followers or sampled:
        plain = len(decodes)
        rows, requests = _sample_rows(dec_reqs[:plain], followers)
        if verifies:     # no followers: a verified request is past its prompt
            draft_rows = np.arange(len(rows), len(rows) + d - plain, dtype=np.int64)
            rows.extend(range(plain, d))
            requests.extend(dec_reqs[plain:])
        more_rows, more = _sample_rows([c.request for c in sampled], followers, d)
        sample_rows = np.asarray(rows + more_rows, dtype=np.int64)
        requests.extend(more)
    else:                     # a decode-only step without dedup: row i samples decode i
        sample_rows, requests = dec_ends, dec_reqs
        if verifies:
            draft_rows = dec_ends[len(decodes):]
    logits_indices, prompt_lp = _with_prompt_rows(logits_indices, plan, d) \
        if prefills else (logits_indices, {})
    input_ids = np.asarray(ids, dtype=np.int64)
    copies = plan.copies
    batch = StepBatch(
        input_ids=input_ids,
        positions=positions,
        slot_mapping=slots,
        num_decodes=d,
        decode_block_tables=dec_tables,
        decode_context_lens=dec_lens,
        **prefill,
        logits_indices=logits_indices,
        sample_rows=sample_rows,
        cow_src=np.asarray([c[0] for c in copies], dtype=np.int64) if copies else _EMPTY_I64,
        cow_dst=np.asarray([c[1] for c in copies], dtype=np.int64) if copies else _EMPTY_I64,
        sampling=_greedy_columns(len(requests)) if kept_greedy and len(requests) == d
        else _sampling_columns(requests),
        prev_token_rows=token_rows,
        prev_rows_in_order=fed_in_order,
        draft_rows=draft_rows,
        draft_ids=draft_ids,
        **prompt_lp,
    )
    return batch, requests
