"""The fake model of the scheduler tests: `KVCheckingRunner` keeps the token id written in
every KV slot and checks each read against the request's tokens, with logits a one-hot of
a deterministic function of the context (`next_token`), so `expected` predicts every
output; `make_engine` puts it under a real LLMEngine and `check_all` checks the
pool/scheduler invariants (tests/engine/core/test_property.py, test_policies.py)."""
from __future__ import annotations

import time

import numpy as np
import torch

from engine.config import make_config
from engine.core.core import LLMEngine
from engine.core.kv.prefix_cache import key_tokens
from engine.request import SamplingParams
from engine.worker.device_io import HostCopyRing
from engine.worker.runner import ModelRunner
from engine.worker.sampling import Sampler

VOCAB = 512          # dummy:tiny
MAX_MODEL_LEN = 64


def context_hash(ctx) -> int:
    """What the fake models read of a context: its length and last six tokens."""
    h = len(ctx) * 1000003
    for i, t in enumerate(ctx[-6:]):
        h = (h * 31 + (t + 1) * (i + 7)) % 2147483647
    return h


def next_token(ctx) -> int:
    """The fake model: a deterministic function of the whole context."""
    return context_hash(ctx) % VOCAB


def expected(prompt, params: SamplingParams, eos) -> tuple[list[int], str]:
    toks, out = list(prompt), []
    while True:
        t = next_token(toks)
        out.append(t)
        toks.append(t)
        if t in params.stop_token_ids or (not params.ignore_eos and t in eos):
            return out, "stop"
        if len(out) >= params.max_tokens or len(toks) >= MAX_MODEL_LEN:
            return out, "length"


class OracleDrafter:
    """A Proposer (engine/core/spec_decode.py) handed to the engine: each draft is the
    fake model's next token with chance `accept`, else a wrong one (so verify steps
    accept, reject and roll back). `model`: the fake model's next token for a context."""
    method = "oracle"

    def __init__(self, accept: float, seed: int, model=next_token):
        self.accept, self.model = accept, model
        self.rng = np.random.default_rng(seed)

    def release(self, request_id: str) -> None:
        pass

    def propose(self, reqs, rooms) -> list[list[int]]:
        out = []
        for req, room in zip(reqs, rooms):
            ctx, draft = req.all_token_ids(), []
            for _ in range(room):
                t = self.model(ctx)
                if self.rng.random() >= self.accept:
                    t = (t + 1) % VOCAB
                draft.append(t)
                ctx.append(t)
            out.append(draft)
        return out


class KVCheckingRunner:
    """Stands in for ModelRunner: a KV cache of token ids, checked on every read; with a
    host tier, a host pool of token ids that the tier's copies move blocks to and from."""

    def __init__(self, pool, vocab: int = VOCAB, host=None):
        self.pool = pool
        self.host = host
        self.bs = pool.block_size
        self.kv = np.full((pool.num_blocks, self.bs), -1, dtype=np.int64)
        self.copy_time = [0.0, 0.0]
        self.host_kv = None if host is None else np.full((host.num_blocks, self.bs), -1,
                                                         dtype=np.int64)
        self.vocab = vocab
        self.forward_calls = 0
        self.violations: list[str] = []
        self.sampler, self.last_tokens = Sampler(torch.device("cpu")), None
        self.graphs = None          # no step graphs: tokens always come from the sampler
        self.prompt_logprobs = None  # no prompt logprobs (the engine reads it each launch)
        self._logprobs_copies = HostCopyRing(slots=6)   # (the real runner's logprobs path)
        self._deferred = None

    # the real runner's step: this forward, then sampling
    execute_model = ModelRunner.execute_model
    sample_deferred = ModelRunner.sample_deferred
    take_logprobs = ModelRunner.take_logprobs
    _sample = ModelRunner._sample
    _verify_random_rows = ModelRunner._verify_random_rows
    release = ModelRunner.release
    close = ModelRunner.close

    def transfer_kv(self, xfer):
        """The real pools' order (engine/worker/kv_transfer.py): host blocks read for
        reloads, device blocks read for offloads, then both written."""
        t0 = time.perf_counter()
        reloaded = self.host_kv[xfer.reload_src].copy()
        t1 = time.perf_counter()
        self.host_kv[xfer.offload_dst] = self.kv[xfer.offload_src]
        t2 = time.perf_counter()
        self.kv[xfer.reload_dst] = reloaded
        self.copy_time[0] += t2 - t1
        self.copy_time[1] += t1 - t0 + time.perf_counter() - t2

    def kv_copy_seconds(self):
        return tuple(self.copy_time)

    def read(self, table, n) -> list[int]:
        return [int(self.kv[table[p // self.bs], p % self.bs]) for p in range(n)]

    def execute(self, batch, prev_tokens=None):
        """The engine turns a failing forward into errored requests; keep the reason so
        that check_all() fails the test with it."""
        try:
            return self._execute(batch, prev_tokens)
        except AssertionError as exc:
            self.violations.append(str(exc))
            raise

    def _execute(self, batch, prev_tokens):
        """Reads only the StepBatch, like the real runner: copy-on-write first, then
        every token into its slot (never a shared block), then each sequence's whole
        context read back through its block table (never an unwritten slot)."""
        self.forward_calls += 1
        bs = self.bs
        ids = batch.input_ids.tolist()
        if batch.prev_token_rows is not None:      # async: the previous step's samples
            for i, row in enumerate(batch.prev_token_rows.tolist()):
                if row >= 0:
                    ids[i] = int(prev_tokens[row])
        assert min(ids, default=0) >= 0, "a pending placeholder reached the forward"
        for src, dst in zip(batch.cow_src.tolist(), batch.cow_dst.tolist()):
            self.kv[dst] = self.kv[src]
        for slot, tok in zip(batch.slot_mapping.tolist(), ids):
            block = slot // bs
            assert self.pool.refcounts[block] == 1, \
                f"a token is written into shared block {block} (no COW)"
            self.kv[block, slot % bs] = tok
        d = batch.num_decodes
        seqs = [(batch.decode_block_tables[i], int(batch.decode_context_lens[i]), i)
                for i in range(d)]
        cu = batch.prefill_cu_seqlens_q.tolist()
        seqs += [(batch.prefill_block_tables[j], int(batch.prefill_context_lens[j]),
                  d + cu[j + 1] - 1) for j in range(batch.num_prefills)]
        ctx_of_row = {}
        for table, n, last_row in seqs:
            assert len(table) * bs >= n, "block table shorter than the context"
            ctx = self.read(table, n)
            assert -1 not in ctx, f"context reads an unwritten KV slot: {ctx}"
            ctx_of_row[last_row] = ctx
        logits = self.logits([ctx_of_row[int(i)] for i in batch.logits_indices.tolist()])
        return logits[torch.from_numpy(batch.sample_rows)] if not batch.samples_in_order else logits

    def logits(self, contexts: list[list[int]]) -> torch.Tensor:
        """One row per context: a one-hot of next_token (a subclass may rank every token)."""
        logits = torch.zeros(len(contexts), self.vocab)
        if contexts:
            rows = torch.tensor([next_token(ctx) for ctx in contexts])
            logits[torch.arange(len(contexts)), rows] = 1.0
        return logits

    def check_index(self):
        """Every indexed block still holds the tokens of its key."""
        for block, key in self.pool.index.items():
            assert self.kv[block].tolist() == key_tokens(key), f"cached block {block} overwritten"
        if self.host is not None:
            for block, key in self.host.pool.index.items():
                assert self.host_kv[block].tolist() == key_tokens(key), \
                    f"host block {block} does not hold its key's tokens"


def host_gib(block_size: int, blocks: int, model: str = "dummy:tiny") -> float:
    """kv_offloading_size (GiB) of a host tier of `blocks` blocks of `model` (float32)."""
    return (blocks + 0.5) * block_bytes(block_size, model) / 2 ** 30


def block_bytes(block_size: int, model: str = "dummy:tiny") -> int:
    from engine.worker.models.loader import model_config
    cfg = model_config(model)
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * block_size * heads * head_dim * 4


def make_engine(num_blocks: int, block_size: int, host_blocks: int = 0, proposer=None,
                runner=KVCheckingRunner, **knobs) -> LLMEngine:
    """A real LLMEngine on dummy:tiny with the KV-checking runner (or a subclass);
    host_blocks: a host tier of that many blocks (kv_offloading_size); proposer: its
    drafts (speculation)."""
    if host_blocks:
        knobs["kv_offloading_size"] = host_gib(block_size, host_blocks)
    eng = LLMEngine(make_config(model="dummy:tiny", device="cpu", dtype="float32",
                                num_blocks=num_blocks, block_size=block_size,
                                max_model_len=MAX_MODEL_LEN, check_invariants=True, **knobs),
                    proposer)
    assert (eng.host.num_blocks if eng.host else 0) == host_blocks
    checking = runner(eng.pool, host=eng.host)
    checking.kv_cache = eng.executor.runner.kv_cache    # (snapshots read its size)
    eng.executor.runner = checking
    return eng


def check_all(eng: LLMEngine) -> None:
    assert not eng.executor.runner.violations, eng.executor.runner.violations[0]
    check_pool(eng)
    eng.executor.runner.check_index()


def check_pool(eng: LLMEngine) -> None:
    """The pool/scheduler invariants of any runner (the real model's too): every block
    free, cached or held as the block tables say; queues consistent; no failed step."""
    assert eng.stats.last_error is None, eng.stats.last_error
    pool, sched = eng.pool, eng.scheduler
    pool.check(sched.block_tables())
    st_ = pool.states()
    assert (st_ == 0).sum() == pool.num_free and (st_ == 2).sum() == pool.num_cached
    assert pool.num_free + pool.num_cached + int((pool.refcounts > 0).sum()) == pool.num_blocks
    for r in sched.waiting:
        assert r.status.value == "waiting" and not r.block_table and r.num_computed_tokens == 0
        assert r.dedup_leader is None
    for r in sched.running:
        assert r.status.value == "running"
        if r.dedup_leader is not None:
            assert not r.block_table and r in sched.followers[r.dedup_leader]
            assert r.dedup_leader in sched.running
        else:
            assert r.num_uncomputed >= 1, f"{r.request_id} can never be scheduled"
            assert len(r.block_table) * pool.block_size >= r.num_computed_tokens
    assert len(sched.running) + len(sched.waiting) + len(eng.structured.compiling) \
        == len(eng.requests)        # (a grammar still compiling: in neither queue)
    if eng.host is not None:                 # both tiers: no block lost or owned twice
        eng.host.check([r for r in sched.waiting if r.swap is not None])
        assert not any(r.swap is not None for r in sched.running)


def run_ops(run, ops: int) -> None:
    """A randomized exactness run (test_exactness_sampled.py, test_exactness_models.py):
    `ops` of its random operations, then its drain; its engine closed either way."""
    try:
        for _ in range(ops):
            run.operate()
        run.drain()
    finally:
        run.eng.close()
