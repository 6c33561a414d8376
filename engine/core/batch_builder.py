"""Builds the StepBatch of a scheduler plan: the one place where requests become arrays.

Vectorized where the batch is wide (decode positions and slots are numpy operations,
block tables rows of the KV manager's BlockTables); per-chunk Python only for prefill
token ids.
"""
from __future__ import annotations

from operator import attrgetter

import numpy as np

from engine.core.kv.block_tables import BlockTables
from engine.core.prompt_logprobs import prompt_rows
from engine.core.sampling_extras import sampling_extras
from engine.core.scheduler import StepPlan, VerifyChunk
from engine.worker.step_batch import SamplingColumns, StepBatch

_EMPTY_I32 = np.zeros((0,), dtype=np.int32)
_EMPTY_I64 = np.zeros((0,), dtype=np.int64)
_NO_TABLES = np.zeros((0, 1), dtype=np.int32)
_NO_PREFILLS = dict(prefill_block_tables=_NO_TABLES, prefill_cu_seqlens_q=np.zeros(1, np.int32),
                    prefill_context_lens=_EMPTY_I32, prefill_max_seqlen_q=0)


_GREEDY_COLUMNS: dict[int, SamplingColumns] = {}   # by row count: the common case, built once
_is_plain_greedy = attrgetter("plain_greedy")


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
    greedy = np.fromiter((p.greedy for p in params), dtype=bool, count=len(params))
    temps = np.fromiter((p.temperature if not p.greedy else 1.0 for p in params), np.float32)
    return SamplingColumns(
        tuple(r.request_id for r in requests), bool(greedy.all()), greedy, temps,
        np.fromiter((p.top_k for p in params), np.int64, count=len(params)),
        np.fromiter((p.top_p for p in params), np.float32, count=len(params)),
        np.fromiter((p.seed is not None for p in params), bool, count=len(params)),
        np.fromiter((p.seed or 0 for p in params), np.uint64, count=len(params)),
        sampling_extras(requests, params))


def _sample_rows(sampled_chunks: list, followers: dict) -> tuple[list[int], list]:
    """Each sampled chunk's logits row, repeated for the dedup followers of its request."""
    if not followers:
        return list(range(len(sampled_chunks))), [c.request for c in sampled_chunks]
    rows, requests = [], []
    for i, c in enumerate(sampled_chunks):
        rows.append(i)
        requests.append(c.request)
        for f in followers.get(c.request, ()):
            rows.append(i)
            requests.append(f)
    return rows, requests


def _decode_columns(decodes: list, device_fed: bool):
    """One pass over the decodes (the wide part of a step): their requests, table rows,
    positions, context lengths and (async scheduling) the previous step's sample row
    that feeds each decode whose token is still pending on the device (None: none is);
    then their host input ids (PENDING_TOKEN ones as 0: the device feeds those), all 0
    when the device feeds every one (a steady async decode step)."""
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
                     d: int) -> tuple[list, list, np.ndarray, list, dict]:
    """The prefill chunks' columns (their token ids appended to `ids`): positions and
    slots (one array per chunk), the logits rows of the chunks that sample, those
    chunks, and the StepBatch's prefill fields."""
    lens = [c.num_tokens for c in prefills]
    pos_parts, slot_parts = [], []
    for c in prefills:
        r = c.request
        if c.__class__ is VerifyChunk:     # its last token, then the drafts it checks
            ids.extend(r.token_slice(c.start, c.start + 1))
            ids.extend(c.draft)
        else:
            ids.extend(r.token_slice(c.start, c.start + c.num_tokens))
        p = np.arange(c.start, c.start + c.num_tokens, dtype=np.int64)
        table = tables.row(r)
        pos_parts.append(p)
        slot_parts.append(table[p // block_size] * block_size + p % block_size)
    ends = d - 1 + np.cumsum(lens, dtype=np.int64)   # a chunk's last token: its logits row
    sampled = [c for c in prefills if c.sample and c.__class__ is not VerifyChunk]
    if len(sampled) < len(prefills):
        ends = ends[[c.sample and c.__class__ is not VerifyChunk for c in prefills]]
    fields = dict(
        prefill_block_tables=tables.gather([c.request for c in prefills]),
        prefill_cu_seqlens_q=np.concatenate(([0], np.cumsum(lens))).astype(np.int32),
        prefill_context_lens=np.asarray([c.start + c.num_tokens for c in prefills], np.int32),
        prefill_max_seqlen_q=max(lens))
    return pos_parts, slot_parts, ends, sampled, fields


def _verify_rows(verifies: list, first_token: int) -> tuple[np.ndarray, np.ndarray]:
    """Speculative decoding: every position of every verify chunk (laid out from token
    row `first_token` on) is a logits row; and the draft each one checks (-1: bonus)."""
    rows = np.arange(first_token, first_token + sum(c.num_tokens for c in verifies),
                     dtype=np.int64)
    drafts = [t for c in verifies for t in (*c.draft, -1)]
    return rows, np.asarray(drafts, dtype=np.int64)


def _with_prompt_rows(logits_indices: np.ndarray, prefills: list, d: int) -> tuple:
    """prompt_logprobs (engine/core/prompt_logprobs.py): every position of the chunks
    of requests that ask, as logits rows after the step's others (no row otherwise)."""
    rows = prompt_rows(prefills, d)
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
    if verifies:           # extends after the prefill chunks, in the same attention call
        prefills = prefills + verifies
    d = len(decodes)
    dec_reqs, dec_rows, dec_pos, dec_lens, ids, token_rows, fed_in_order = \
        _decode_columns(decodes, device_fed)
    if d:
        dec_tables = tables.gather_rows(dec_rows)
        block, offset = np.divmod(dec_pos, block_size)
        dec_slots = tables.matrix[dec_rows, block] * block_size + offset   # int64
    else:
        dec_tables, dec_slots = _NO_TABLES, _EMPTY_I64
    # sample rows: every decode, every prefill chunk that reaches the end of its tokens
    dec_ends = np.arange(d, dtype=np.int64)
    if prefills:
        pos_parts, slot_parts, ends, sampled, prefill = _prefill_columns(
            prefills, ids, tables, block_size, d)
        positions = np.concatenate([dec_pos] + pos_parts)
        slots = np.concatenate([dec_slots] + slot_parts)
        logits_indices = np.concatenate((dec_ends, ends))
    else:
        positions, slots, logits_indices, sampled, prefill = \
            dec_pos, dec_slots, dec_ends, [], _NO_PREFILLS
    draft_rows = draft_ids = None
    if verifies:
        first = positions.shape[0] - sum(c.num_tokens for c in verifies)
        verify_rows, draft_ids = _verify_rows(verifies, first)
        base = logits_indices.shape[0]
        logits_indices = np.concatenate((logits_indices, verify_rows))
        rows, requests = _sample_rows(decodes + sampled, followers)
        draft_rows = np.arange(len(rows), len(rows) + verify_rows.shape[0], dtype=np.int64)
        rows.extend(range(base, base + verify_rows.shape[0]))
        requests.extend(c.request for c in verifies for _ in range(c.num_tokens))
        sample_rows = np.asarray(rows, dtype=np.int64)
    elif followers or sampled:
        rows, requests = _sample_rows(decodes + sampled, followers)
        sample_rows = np.asarray(rows, dtype=np.int64)
    else:                     # a decode-only step without dedup: row i samples decode i
        sample_rows, requests = dec_ends, dec_reqs
    logits_indices, prompt_lp = _with_prompt_rows(logits_indices, prefills, d) \
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
        sampling=_sampling_columns(requests),
        prev_token_rows=token_rows,
        prev_rows_in_order=fed_in_order,
        draft_rows=draft_rows,
        draft_ids=draft_ids,
        **prompt_lp,
    )
    return batch, requests
