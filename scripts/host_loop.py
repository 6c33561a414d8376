"""The engine harness of scripts/host_step_profile.py: an LLMEngine on the CPU with its
model's forward stubbed (or only the model's, keeping the runner), an emulated device's
time, the engine process's KV event publisher, and the closed loop that drives it
(requests in flight, a new one as one finishes). Imported after host_step_profile put
the engine tree it measures on the path (--trees)."""
from __future__ import annotations

import time

import numpy as np
import torch

from benchmarks.oracle import OracleProposer
from engine.config import SpeculativeConfig, make_config
from engine.core.core import LLMEngine
from engine.front.processor import OutputProcessor
from engine.ipc.proc_setup import time_collections
from engine.outputs import CoreRequest
from engine.request import SamplingParams
from engine.worker.device_io import HostCopy
from roseplay.workload.driver import TOP_LOGPROBS


STOP_TOKEN, STOP_AFTER = 9, 30     # --stop-rows: the token, from this many forwards on
ROUND_START = [0]                  # the forward count when the burst round began


def stub_forward(engine: LLMEngine, stop_rows: int = 0) -> None:
    """Every sample row gets token 7 at once (greedy, EOS ignored): no model runs. With
    stop_rows, from the STOP_AFTER-th forward of a burst round on, that many rows of a
    step (more than 8 rows) get STOP_TOKEN instead."""
    runner = engine.executor.runner

    def execute_model(batch):
        runner.forward_calls += 1
        n = batch.sample_rows.shape[0]
        tokens = torch.full((n,), 7, dtype=torch.int64)
        if stop_rows and runner.forward_calls - ROUND_START[0] > STOP_AFTER and n > 8:
            for k in range(stop_rows):
                tokens[(runner.forward_calls * (7 + 6 * k)) % n] = STOP_TOKEN
        return tokens
    runner.execute_model = execute_model


def stub_model_forward(engine: LLMEngine) -> None:
    """Keep the runner; the model's forward returns logits [rows, V] with token 7 on top
    (a slice of one preallocated tensor: the stub itself costs next to nothing)."""
    model = engine.executor.runner.model
    logits = torch.zeros(max(engine.config.scheduler.max_num_batched_tokens, 1024),
                         engine.vocab_size, dtype=engine.dtype)
    logits[:, 7] = 1

    def forward(input_ids, positions, meta, logits_indices):
        # logits_indices None: a decode-only step through the step graphs' buffers,
        # where every row samples
        rows = input_ids.shape[0] if logits_indices is None else logits_indices.shape[0]
        return logits[:rows]
    model.forward = forward


class _DeviceTime(HostCopy):
    """A step's tokens that are on the host only once its emulated forward ended."""

    def __init__(self, copy: HostCopy, done: float):
        super().__init__(copy._tensor)
        self._copy, self._done = copy, done

    def tolist(self) -> list:
        while time.perf_counter() < self._done:   # spun, as a CUDA event's wait is: a
            pass                                   # sleep overshoots by more than a step
        return self._copy.tolist()


def emulate_device(engine: LLMEngine, ms: float) -> None:
    """--device-ms: each step's tokens are ready `ms` after its forward starts, forwards
    one at a time, each starting at its launch or at the end of the one before."""
    ring = engine.executor._host_copies
    start, free_at = ring.start, [0.0]

    def timed(tensor):
        free_at[0] = max(time.perf_counter(), free_at[0]) + ms / 1e3
        return _DeviceTime(start(tensor), free_at[0])
    ring.start = timed


def attach_publisher(engine: LLMEngine):
    """The engine process's KV event publisher on a loopback port (engine/ipc/core_proc.py
    attaches it the same way)."""
    from engine.ipc.auth import new_key
    from engine.ipc.kv_publisher import KVEventPublisher
    cfg = engine.config
    publisher = KVEventPublisher(cfg.kv_events_config, "tcp://127.0.0.1:*", None, new_key(),
                                 cfg.block_size)
    engine.kv_events.sink = publisher.publish
    return publisher


class ClosedLoop:
    def __init__(self, engine: LLMEngine, oracle: OracleProposer | None, concurrency: int,
                 input_len: int, output_len: int, seed: int = 0, front: bool = False,
                 logprobs_every: int = 0):
        self.engine, self.input_len = engine, input_len
        self.logprobs_every = logprobs_every   # 1 request in this many asks its top 5
        # --front: LLM.generate's output processing, each request with a finish sink
        self.front = OutputProcessor(engine.tokenizer) if front else None
        self.oracle = oracle          # proposes the stub's token 7 (--speculative)
        self.reference = [7] * output_len
        self.params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True,
                                     stop_token_ids=[STOP_TOKEN])
        self.prompts = np.random.default_rng(seed).integers(100, 30000, (64, input_len))
        self.next_id = 0
        for i in range(concurrency):   # staggered lengths: finishes spread over the steps
            self.submit(SamplingParams(max_tokens=1 + i * output_len // concurrency,
                                       temperature=0.0, ignore_eos=True))

    def submit(self, params: SamplingParams | None = None) -> None:
        ids = self.prompts[self.next_id % len(self.prompts)].copy()
        ids[0] = self.next_id          # distinct prompts: no prefix hits, no dedup
        if self.oracle is not None:
            self.oracle.refs[tuple(ids.tolist())] = self.reference
        params = params or self.params
        if self.logprobs_every and self.next_id % self.logprobs_every == 0:
            params = params.replace(logprobs=TOP_LOGPROBS)
        creq = CoreRequest(f"r{self.next_id}", tuple(ids.tolist()), params,
                           time.perf_counter())
        if self.front is not None:
            self.front.add(creq, None, None, _drop)
        self.engine.add(creq)
        self.next_id += 1

    def step(self) -> int:
        out = self.engine.step()
        if self.front is not None:
            self.front.process(out)
        for _ in out.finished:
            self.submit()
        return len(out.token_ids)


def _drop(event) -> None:
    """A finished request's final event, dropped (LLM.generate keeps its output)."""


def make_engine(args):
    """(engine, oracle, KV event publisher) as the options ask, the forward stubbed."""
    torch.set_num_threads(1)   # the host thread's work only (no intra-op pool spinning)
    oracle = OracleProposer(p=args.oracle_p) if args.speculative else None
    spec = {}
    if args.speculative and hasattr(SpeculativeConfig, "disable_by_batch_size"):
        # every step verifies (a checkout without the off-switch: --trees)
        spec["speculative_config"] = {"method": "ngram", "disable_by_batch_size": None}
    if args.kv_events:
        spec["kv_events_config"] = {"enable_kv_cache_events": True}
    engine = LLMEngine(make_config(model=args.model, device="cpu", num_blocks=args.num_blocks,
                                   max_num_seqs=args.concurrency,
                                   max_num_batched_tokens=args.max_num_batched_tokens,
                                   num_speculative_tokens=args.speculative, **spec), oracle)
    if args.runner:
        stub_model_forward(engine)
    else:
        stub_forward(engine, args.stop_rows)
    if args.device_ms:
        emulate_device(engine, args.device_ms)
    publisher = attach_publisher(engine) if args.kv_events else None
    time_collections(engine.counters)    # frozen after start-up, as the engine process
    return engine, oracle, publisher


def warm_loop(args):
    """(engine, closed loop, KV event publisher) as the options ask, the loop stepped
    --warmup-steps times."""
    engine, oracle, publisher = make_engine(args)
    loop = ClosedLoop(engine, oracle, args.concurrency, args.input_len, args.output_len,
                      front=args.front, logprobs_every=args.logprobs_every)
    for _ in range(args.warmup_steps):
        loop.step()
    return engine, loop, publisher
