"""ModelRunner: runs one StepBatch through the model and samples its tokens.

Owns the paged KV cache ([2, layers, blocks, block_size, kv_heads, head_dim], in the
kv_cache_dtype: the model's, or float8 e4m3 with per-head scales, docs/KV_TIERS.md), the
CUDA graphs of whole steps (engine/worker/cuda_graphs.py: decode-only steps per bucketed batch
size, mixed steps per bucketed token count; a step no graph holds runs eagerly) and the
sampler. Reads only the StepBatch (engine/worker/step_batch.py): no request or scheduler
objects, so a tensor-parallel worker runs the same code on a batch it received. Every
rank samples (the vocab gather leaves the same full logits on each, and the sampler's
generators are seeded alike), so each keeps the step's tokens on its own device: a
continuation step (async scheduling) takes its inputs from there, with no host round
trip and no broadcast of tokens (as vLLM V1's workers do).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from engine.config import LOGPROBS_MODES
from engine.worker.cuda_graphs import StepGraphs
from engine.worker.device_io import HostCopyRing, to_device
from engine.worker.kv_transfer import HostKVCache, KVTransfer
from engine.worker.models.layers import AttentionMetadata
from engine.worker.placement import attach_kv_cache, resolve_kv_cache_dtype
from kernels.kv_quant import byte_view
from engine.worker.rejection import rejection_sample, seeded_generators, target_probs
from engine.worker.logprobs import LogprobsCopy, prompt_logprobs
from engine.worker.sampling import Sampler
from engine.worker.step_buffers import device_fed, gather_fed
from engine.worker.grammar_mask import masked_logits
from engine.worker.step_batch import GrammarMask, SamplingColumns, StepBatch
from engine.worker.warmup import (warm_up_attention, warm_up_logits, warm_up_logprobs,
                                  warm_up_token_feed)


def _verified_rows_greedy(batch: StepBatch) -> SamplingColumns:
    """The step's sampling columns with its verified rows greedy: the rejection sampler
    draws the random ones, so the sampler spends no draw (nor a seeded request's
    generator) on them, and a step whose random rows all verify takes the argmax path."""
    cols = batch.sampling
    if cols.all_greedy:
        return cols
    greedy = cols.greedy.copy()
    greedy[batch.draft_rows] = True
    return dataclasses.replace(cols, greedy=greedy, all_greedy=bool(greedy.all()))


class ModelRunner:
    def __init__(self, model, ops, device: torch.device, dtype: torch.dtype, num_blocks: int,
                 block_size: int, max_model_len: int, use_cuda_graphs: bool,
                 graph_safe_ops: bool, max_graph_batch: int = 512, async_scheduling: bool = False,
                 max_mixed_graph_tokens: int = 0, seed: int = 0,
                 logprobs_mode: str = LOGPROBS_MODES[0], max_verify_rows: int = 0,
                 kv_cache_dtype: str = "auto", calculate_kv_scales: bool = False,
                 host_kv_bytes: int = 0):
        self.model, self.ops, self.device, self.dtype = model, ops, device, dtype
        self.sampler = Sampler(device, seed, logprobs_mode, ops.top_logprobs)
        # the logprobs' copies to the host (two a step at most: the sampled view and the
        # raw one), read a step later under async scheduling
        self._logprobs_copies = HostCopyRing(slots=6)
        self.last_tokens: torch.Tensor | None = None   # the last step's samples, on device
        # the last step's prompt logprobs, packed (engine/worker/logprobs.py)
        self.prompt_logprobs: torch.Tensor | None = None
        self._deferred: tuple | None = None   # (batch, logits) of a forward whose sampling
        #                                       waits for its grammar mask (sample_deferred)
        self.block_size = block_size
        self.max_blocks_per_seq = -(-max_model_len // block_size)
        self.kv_cache, self.kv_scales = attach_kv_cache(
            model, ops, num_blocks, block_size,
            resolve_kv_cache_dtype(kv_cache_dtype, dtype, device), device)
        # calculate_kv_scales: the first step that stores K/V sets them (eagerly)
        self.scales_pending = calculate_kv_scales and self.kv_scales is not None
        # the host tier's pool (kv_offloading_size: this rank's share of its bytes, in
        # the device pool's layout and dtype: fp8 blocks move as bytes, their scales stay)
        per_block = self.kv_cache[:, :, :1].numel() * self.kv_cache.element_size()
        self.host_kv = HostKVCache(self.kv_cache, host_kv_bytes // per_block) \
            if host_kv_bytes >= per_block else None
        self.forward_calls = 0
        self.graphs = None    # steps through static buffers (captured unless eager)
        if device.type == "cuda" and graph_safe_ops:
            self.graphs = StepGraphs(self, max_graph_batch, use_cuda_graphs,
                                     max_mixed_tokens=max_mixed_graph_tokens,
                                     max_verify_rows=max_verify_rows)
            if use_cuda_graphs:
                self.graphs.capture()
            else:
                self.graphs.warm()
            warm_up_attention(self)   # start-up kernel compiles (engine/worker/warmup.py)
            warm_up_logits(self, self.graphs.max_seqs)   # (verify rows included)
            warm_up_token_feed(self.device, self.graphs.max_seqs)
            warm_up_logprobs(self)
        elif async_scheduling:   # CPU: same static-buffer decode path, unpadded, no graphs
            self.graphs = StepGraphs(self, max_graph_batch, use_graphs=False, pad=False,
                                     max_verify_rows=max_verify_rows)

    def close(self) -> None:
        """Drop the CUDA graphs: a graph that captured NCCL collectives holds a reference
        on the communicator, and destroying the process group waits for it forever
        (pytorch#115388), so graphs go first."""
        if self.graphs is not None:
            self.graphs.release()

    # -- per step --------------------------------------------------------------------
    def execute_model(self, batch: StepBatch) -> torch.Tensor | None:
        """Forward, then sample: the step's tokens, on the device (kept for the next step,
        whose decode rows may read them: batch.prev_token_rows). A batch whose grammar
        mask is still to come (batch.grammar.bitmask None) runs its forward only and
        returns None: sample_deferred(mask) samples it (engine/core/core.py)."""
        self.sampler.begin()
        prev = self.last_tokens if batch.prev_token_rows is not None else None
        logits = self.execute(batch, prev)
        greedy = self.graphs.greedy if self.graphs is not None else None
        if batch.grammar is not None and batch.grammar.bitmask is None:
            self._deferred = (batch, logits)
            return None
        return self._sample(batch, logits, greedy, batch.grammar)

    def sample_deferred(self, grammar: GrammarMask) -> torch.Tensor:
        """Sample the step whose forward execute_model ran, now that its mask is known."""
        (batch, logits), self._deferred = self._deferred, None
        return self._sample(batch, logits, None, grammar)

    def _sample(self, batch: StepBatch, logits: torch.Tensor, greedy: torch.Tensor | None,
                grammar: GrammarMask | None) -> torch.Tensor:
        cols = batch.sampling if batch.draft_rows is None else _verified_rows_greedy(batch)
        model_logits = logits
        if grammar is not None:       # disallowed tokens -inf, before every sampling step
            logits = masked_logits(logits, grammar)
        # the decode graph's own argmax (no launch after it) where every row is greedy
        argmax = greedy if grammar is None and batch.samples_in_order else None
        tokens = self.sampler.sample(logits, cols, model_logits, argmax)
        if batch.draft_rows is not None:
            tokens = self._verify_random_rows(logits, batch, tokens)
        self.last_tokens = tokens
        return tokens

    def _verify_random_rows(self, logits: torch.Tensor, batch: StepBatch,
                            tokens: torch.Tensor) -> torch.Tensor:
        """Random rows of verified positions take the rejection sampler's token (greedy
        rows keep the argmax: the host accepts a draft equal to it)."""
        cols = batch.sampling
        if cols.all_greedy:
            return tokens
        rows = batch.draft_rows[~cols.greedy[batch.draft_rows]]
        if not rows.shape[0]:
            return tokens
        dev = logits.device
        idx = to_device(rows, torch.int64, dev)
        drafts = batch.draft_ids[~cols.greedy[batch.draft_rows]]
        probs = target_probs(logits.index_select(0, idx), cols.temperature[rows],
                             cols.top_k[rows], cols.top_p[rows])
        seeded = seeded_generators(self.sampler.generators, cols, rows, dev) \
            if cols.seeded.any() else None
        for gen in {id(g): g for g in (seeded or {}).values()}.values():
            self.sampler.will_draw(gen)
        out = rejection_sample(probs, to_device(drafts, torch.int64, dev), None,
                               self.sampler.generator, seeded)
        return tokens.clone().index_copy_(0, idx, out.to(tokens.dtype))

    def take_logprobs(self, batch: StepBatch) -> LogprobsCopy | None:
        """The last step's logprobs (rows that asked), copying to the host; None if none."""
        packed = self.sampler.last_logprobs
        if packed is None:
            return None
        ex = batch.sampling.extras
        return LogprobsCopy(packed, ex.logprob_rows, ex.raw_rows, self._logprobs_copies)

    def transfer_kv(self, xfer: KVTransfer) -> None:
        """One step's copies between the device pool and the host tier, queued before
        the step's forward (engine/worker/kv_transfer.py)."""
        self.host_kv.transfer(xfer)

    def kv_copy_seconds(self) -> tuple[float, float]:
        """(to the host, from the host): seconds the tier's completed copies took."""
        return self.host_kv.copy_seconds()

    def rewind_draws(self) -> None:
        """The launch failed after its sampling: undo its draws (Sampler.rewind)."""
        self.sampler.rewind()

    def release(self, request_ids) -> None:
        """These requests ended: drop their sampler state. The core passes one id (it
        calls `executor.release(request_id)`, and at TP=1 the executor is this runner);
        a TP worker passes the step's list."""
        if isinstance(request_ids, str):
            request_ids = (request_ids,)
        for rid in request_ids:
            self.sampler.release(rid)

    @torch.inference_mode()
    def execute(self, batch: StepBatch, prev_tokens: torch.Tensor | None = None) -> torch.Tensor:
        """Run the batch's forward; return the logits of its sample rows [R, V] (model
        dtype). prev_tokens: the previous step's samples on the device, when the batch's
        decode inputs come from them (batch.prev_token_rows, async scheduling)."""
        self.copy_blocks(batch.cow_src, batch.cow_dst)
        self.forward_calls += 1
        if self.graphs is not None:
            self.graphs.greedy = None
        token_source = None
        if batch.prev_rows_in_order and prev_tokens.shape[0] == batch.num_decodes:
            token_source = prev_tokens, None      # (the steady case, without numpy)
        elif batch.prev_token_rows is not None:
            token_source = gather_fed(batch.prev_token_rows, prev_tokens)
        lp_rows = batch.prompt_logprob_rows     # prompt_logprobs: eager (rows of any count)
        key = self.graphs.key(batch) if self.graphs is not None and lp_rows is None else None
        if key is not None and not self.scales_pending:
            logits = self.graphs.run(batch, token_source, key)
        elif self.scales_pending:
            logits = self._calibrating_forward(batch, token_source)
        else:
            logits = self._eager_forward(batch, token_source)
        self.prompt_logprobs = None if lp_rows is None else prompt_logprobs(
            self.ops.top_logprobs, logits, lp_rows, batch.prompt_logprob_targets,
            batch.num_prompt_logprobs)
        if batch.samples_in_order:
            return logits
        return logits.index_select(0, to_device(batch.sample_rows, torch.int64, logits.device))

    def _calibrating_forward(self, batch: StepBatch, token_source) -> torch.Tensor:
        """The first step, eagerly (no graph captures the scale computation), with every
        attention layer setting its fp8 scales from the K/V it stores before storing them
        (calculate_kv_scales). Nothing is stored before: the pool is empty until now."""
        layers = self.model.attention_layers()
        for layer in layers:
            layer.calibrating = True
        try:
            return self._eager_forward(batch, token_source)
        finally:
            for layer in layers:
                layer.calibrating = False
            self.scales_pending = False

    def copy_blocks(self, src: np.ndarray, dst: np.ndarray) -> None:
        """All copy-on-write copies of a step, every layer, K and V: one batched op."""
        if not src.shape[0]:
            return
        src_t = to_device(src, torch.int64, self.device)
        dst_t = to_device(dst, torch.int64, self.device)
        kv = byte_view(self.kv_cache)       # fp8: as bytes (no CPU index_copy_ for it)
        kv.index_copy_(2, dst_t, kv.index_select(2, src_t))

    def _eager_forward(self, batch: StepBatch, token_source: tuple | None) -> torch.Tensor:
        dev = self.device
        to = lambda a, dt: torch.from_numpy(np.ascontiguousarray(a, dtype=dt)).to(dev, non_blocking=True)
        meta = AttentionMetadata(slot_mapping=to(batch.slot_mapping, np.int64),
                                 num_decode_tokens=batch.num_decodes,
                                 decode_rows_shared=batch.draft_rows is not None)
        if batch.num_decodes:
            meta.decode_block_tables = to(batch.decode_block_tables, np.int32)
            meta.decode_context_lens = to(batch.decode_context_lens, np.int32)
        if batch.num_prefills:
            meta.prefill_block_tables = to(batch.prefill_block_tables, np.int32)
            meta.prefill_cu_seqlens_q = to(batch.prefill_cu_seqlens_q, np.int32)
            meta.prefill_context_lens = to(batch.prefill_context_lens, np.int32)
            meta.prefill_max_seqlen_q = batch.prefill_max_seqlen_q
        ids = to(batch.input_ids, np.int64)
        if token_source is not None:
            ids = torch.cat((device_fed(ids, token_source), ids[batch.num_decodes:]))
        return self.model(ids, to(batch.positions, np.int64), meta,
                          to(batch.logits_indices, np.int64))
