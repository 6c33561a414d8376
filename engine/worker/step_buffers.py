"""Persistent step inputs for the CUDA graphs: device buffers of fixed capacity, filled
in place from a StepBatch (engine/worker/step_batch.py) before each replay.

One set of buffers serves every captured graph (decode-only and mixed): a graph reads
the leading rows its bucket covers. Padding is harmless by construction: padding tokens
store no K/V (slot -1) and belong to no sequence (the unified attention skips them);
padding decode rows attend to one position; padding logits rows read row 0.

Host staging is pinned and double-buffered: copies from pageable memory would wait for
the stream (and so for the step in flight); pinned ones are truly async. Two suffice: a
buffer is refilled two steps later, after its step was synced. Every copy is one
contiguous range (a strided host-to-device copy makes torch stage it through pageable
temporaries): ids | positions | slots of a bucket of P tokens lie at [0, 3P) of one
buffer (each bucket's graph is captured with its own views), the block tables go as
whole rows, the sequence metadata and (mixed steps) the logits rows as they are.
"""
from __future__ import annotations

import numpy as np
import torch

from engine.worker import device_io
from engine.worker.device_io import copy_, device_alias
from engine.worker.models.layers import AttentionMetadata


def gather_fed(rows: np.ndarray, prev: torch.Tensor) -> tuple:
    """(tokens, mask): the decodes' inputs gathered from the previous step's samples on
    the device (rows: each decode's sample row there, -1 = not fed), and which decode
    rows take them (None: every row)."""
    fed = rows >= 0
    if fed.all():
        if rows.shape[0] == prev.shape[0] and (rows == np.arange(rows.shape[0])).all():
            return prev, None
        return prev.index_select(0, device_io.to_device(rows, torch.int64, prev.device)), None
    src = prev.index_select(0, device_io.to_device(np.where(fed, rows, 0), torch.int64,
                                                   prev.device))
    return src, device_io.to_device(fed, torch.bool, prev.device)


def device_fed(ids: torch.Tensor, token_source: tuple) -> torch.Tensor:
    """The decode rows' input ids with the device-fed ones (async scheduling) put in:
    token_source = (tokens gathered from the previous step's samples, row mask or None)."""
    tokens, mask = token_source
    return tokens if mask is None else torch.where(mask, tokens, ids[:tokens.shape[0]])


_PAD_TOKEN = np.array([[0], [0], [-1]], dtype=np.int64)   # id, position, slot (none)


class StepBuffers:
    def __init__(self, device: torch.device, max_tokens: int, max_seqs: int,
                 max_blocks_per_seq: int, max_logits: int):
        t, s, w = max_tokens, max_seqs, max_blocks_per_seq
        self.max_tokens, self.max_seqs = t, s
        self.tokens = torch.zeros(3 * t, dtype=torch.int64, device=device)  # see views()
        # [qsl (S+1) | seq_lens (S)]: a decode-only graph reads seq_lens as its context lens
        self.seq_meta = torch.zeros(2 * s + 1, dtype=torch.int32, device=device)
        self.seq_meta[s + 1:].fill_(1)
        self.query_start_loc, self.seq_lens = self.seq_meta[:s + 1], self.seq_meta[s + 1:]
        self.block_tables = torch.zeros(s, w, dtype=torch.int32, device=device)
        self.logits_indices = torch.zeros(max_logits, dtype=torch.int64, device=device)
        pin = device.type == "cuda"
        self._stage = [(torch.zeros(3 * t, dtype=torch.int64, pin_memory=pin),
                        torch.ones(2 * s + 1, dtype=torch.int32, pin_memory=pin),
                        torch.zeros(s, w, dtype=torch.int32, pin_memory=pin),
                        torch.zeros(max_logits, dtype=torch.int64, pin_memory=pin))
                       for _ in range(2)]
        # the same staging seen from the GPU: a decode step's small inputs go in by a
        # kernel, not a memcpy (engine/worker/device_io.py)
        self._alias = [tuple(device_alias(t, device) for t in stage) for stage in self._stage]
        self._flip = 0
        self._decode_views: dict[tuple[int, int], tuple] = {}   # (flip, rows): see _views

    # -- the views a graph is captured with ----------------------------------------------
    def views(self, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input_ids, positions, slot_mapping) of a bucket of `size` tokens."""
        return self.tokens[:size], self.tokens[size:2 * size], self.tokens[2 * size:3 * size]

    def reset(self, size: int) -> None:
        """Inputs that touch no state, for a warm-up or a capture: no slot (nothing is
        stored), no sequence, decode rows of length 1."""
        self.tokens[:2 * size].zero_()
        self.tokens[2 * size:3 * size].fill_(-1)
        self.seq_meta[:self.max_seqs + 1].zero_()
        self.seq_lens.fill_(1)

    def decode_meta(self, bs: int, verify: bool = False) -> AttentionMetadata:
        """verify: rows of one request verify its drafts (AttentionMetadata.decode_rows_shared)."""
        return AttentionMetadata(slot_mapping=self.views(bs)[2], num_decode_tokens=bs,
                                 decode_block_tables=self.block_tables[:bs],
                                 decode_context_lens=self.seq_lens[:bs],
                                 decode_rows_shared=verify)

    def mixed_meta(self, num_tokens: int) -> AttentionMetadata:
        return AttentionMetadata(slot_mapping=self.views(num_tokens)[2],
                                 num_decode_tokens=0, query_start_loc=self.query_start_loc,
                                 seq_lens=self.seq_lens, block_tables=self.block_tables)

    # -- per step ------------------------------------------------------------------------
    def fill(self, batch, padded: int, mixed: bool,
             token_source: tuple | None = None) -> None:
        """Copy the batch into the buffers, padded to `padded` tokens (decode-only: rows).
        mixed: also the query start locations of every sequence slot and the logits rows.
        token_source: (tokens, mask) of the decodes fed from the device (async scheduling)."""
        if not mixed:
            self._fill_decode(batch, padded, token_source)
            return
        stage64, stage_meta, stage_table, stage_logits = self._stage[self._flip]
        self._flip ^= 1
        n, d, s = batch.num_tokens, batch.num_decodes, self.max_seqs
        ids, pos, slots = stage64[:3 * padded].numpy().reshape(3, padded)
        ids[:n], pos[:n], slots[:n] = batch.input_ids, batch.positions, batch.slot_mapping
        ids[n:], pos[n:], slots[n:] = 0, 0, -1
        self.tokens[:3 * padded].copy_(stage64[:3 * padded], non_blocking=True)
        if token_source is not None:
            self.tokens[:d].copy_(device_fed(self.tokens, token_source))
        meta = stage_meta.numpy()
        lens = meta[s + 1:]
        lens[:d] = batch.decode_context_lens
        nseq = d + batch.num_prefills
        self._fill_tables(batch, stage_table.numpy())
        qsl = meta[:s + 1]
        qsl[:d + 1] = np.arange(d + 1)
        qsl[d + 1:nseq + 1] = d + batch.prefill_cu_seqlens_q[1:]
        qsl[nseq + 1:] = n
        lens[d:nseq] = batch.prefill_context_lens
        lens[nseq:] = 1
        self.seq_meta.copy_(stage_meta, non_blocking=True)
        rows = batch.logits_indices.shape[0]
        logits = stage_logits.numpy()
        logits[:rows] = batch.logits_indices
        logits[rows:] = 0
        self.logits_indices.copy_(stage_logits, non_blocking=True)
        if nseq:
            self.block_tables[:nseq].copy_(stage_table[:nseq], non_blocking=True)

    def _fill_decode(self, batch, padded: int, token_source: tuple | None) -> None:
        """fill() of a decode-only step: tokens, lengths and whole table rows of all
        `padded` rows (a padding row's stale block ids are never read past its length
        of 1), staged through views made once per bucket, then copied in one launch
        (else as three copies and the device-fed ids)."""
        tokens, lens, table, copies = self._views(padded)
        d = batch.num_decodes
        if token_source is None or token_source[1] is not None:   # (else every id is fed)
            tokens[0, :d] = batch.input_ids
        tokens[1, :d], tokens[2, :d] = batch.positions, batch.slot_mapping
        lens[:d] = batch.decode_context_lens
        if padded > d:
            tokens[:, d:] = _PAD_TOKEN
            lens[d:] = 1
        if d:
            table[:d, :batch.decode_block_tables.shape[1]] = batch.decode_block_tables
        if self._one_launch(copies, token_source):
            return
        for dst, src, alias in copies:
            copy_(dst, src, alias)
        if token_source is not None:
            copy_(self.tokens[:d], device_fed(self.tokens, token_source))

    def warm_decode_inputs(self) -> None:
        """Compile the one-launch input copy's variants (fed ids or not, table rows or
        not) at start-up, on the real buffers (pointer alignment is specialized on),
        not at the first step that needs each. Leaves the buffers as reset() does."""
        if self._alias[0][0] is None:
            return
        from kernels.step_inputs import copy_decode_inputs
        for _ in range(2):                  # each call to _views takes the other staging
            _, _, _, copies = self._views(1)
            (tok, _, tok_alias), (lens, _, lens_alias), (table, _, table_alias) = copies
            for fed in (None, tok[:1]):
                for table_rows in (True, False):
                    copy_decode_inputs(tok_alias, lens_alias, table_alias, tok, lens, table,
                                       fed, table=table_rows)
        self.reset(1)

    def _one_launch(self, copies, token_source: tuple | None) -> bool:
        """The decode inputs in one kernel reading the staging over the bus, if it has
        a device view and the device-fed rows (if any) all are (the table rows go by
        memcpy when large). False: nothing was copied."""
        (tok, _, tok_alias), (lens, _, lens_alias), (table, table_src, table_alias) = copies
        if tok_alias is None or lens_alias is None or table_alias is None \
                or (token_source is not None and token_source[1] is not None):
            return False
        from kernels.step_inputs import copy_decode_inputs
        small = table.numel() * table.element_size() <= device_io.KERNEL_COPY_MAX_BYTES
        if not small:
            table.copy_(table_src, non_blocking=True)
        copy_decode_inputs(tok_alias, lens_alias, table_alias, tok, lens, table,
                           None if token_source is None else token_source[0], table=small)
        return True

    def _views(self, rows: int) -> tuple:
        """The staging buffer's numpy views a decode step of `rows` (padded) fills, and
        its copies (device view, staging view, staging alias or None), made once per
        bucket and staging buffer (views cost the host more than a small copy)."""
        key = (self._flip, rows)
        self._flip ^= 1
        views = self._decode_views.get(key)
        if views is None:
            stage64, stage_meta, stage_table, _ = self._stage[key[0]]
            alias64, alias_meta, alias_table, _ = self._alias[key[0]]
            s = self.max_seqs
            cut = lambda t, a, b: None if t is None else t[a:b]     # noqa: E731
            copies = ((self.tokens[:3 * rows], stage64[:3 * rows], cut(alias64, 0, 3 * rows)),
                      (self.seq_lens[:rows], stage_meta[s + 1:s + 1 + rows],
                       cut(alias_meta, s + 1, s + 1 + rows)),
                      (self.block_tables[:rows], stage_table[:rows], cut(alias_table, 0, rows)))
            views = self._decode_views[key] = (
                stage64[:3 * rows].numpy().reshape(3, rows),
                stage_meta[s + 1:s + 1 + rows].numpy(), stage_table[:rows].numpy(), copies)
        return views

    @staticmethod
    def _fill_tables(batch, table: np.ndarray) -> None:
        """Decode rows then prefill rows into the staged table (columns past a row's
        blocks keep stale block ids: never read, as the lengths bound every read)."""
        d, p = batch.num_decodes, batch.num_prefills
        if d:
            table[:d, :batch.decode_block_tables.shape[1]] = batch.decode_block_tables
        if p:
            table[d:d + p, :batch.prefill_block_tables.shape[1]] = batch.prefill_block_tables
