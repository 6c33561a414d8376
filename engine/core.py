"""LLMEngine: the synchronous engine core (one thread owns it).

make_request (any thread: tokenize + validate) -> add -> step() repeatedly. A step
schedules, runs one forward, samples, updates requests, and records step stats.
"""
from __future__ import annotations

import itertools
import time
from collections import deque

import torch

from engine import overlap
from engine.config import EngineConfig, InvalidRequestError, SchedulerConfig
from engine.detokenizer import IncrementalDetokenizer
from engine.kv.block_pool import BlockPool
from engine.models.loader import load_model
from engine.request import Request, RequestStatus, SamplingParams
from engine.runner import ModelRunner
from engine.sampling import Sampler
from engine.scheduler import Scheduler, StepPlan
from engine.snapshot import ChunkInfo, EngineSnapshot, StepStats, request_view
from engine.stats import StatsRecorder

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
CPU_DEFAULT_BLOCKS = 2048


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise InvalidRequestError("device 'cuda' requested but no CUDA GPU is available")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[name]


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        torch.manual_seed(config.seed)
        loaded = load_model(config.model, self.device, self.dtype, config.seed)
        self.model_name, self.tokenizer = loaded.name, loaded.tokenizer
        self.eos_token_ids = frozenset(loaded.eos_token_ids)
        self.vocab_size = loaded.model.config.vocab_size
        self.max_model_len = min(config.max_model_len or min(loaded.max_model_len, 8192),
                                 loaded.max_model_len)
        backend = config.attention_backend
        if backend == "auto":
            backend = "triton" if self.device.type == "cuda" else "torch"
        from kernels import get_ops
        ops = get_ops(backend)
        self.backend = backend
        num_blocks = config.num_blocks or self._blocks_from_memory(loaded.model)
        self.pool = BlockPool(num_blocks, config.block_size)
        self.scheduler = Scheduler(config.scheduler, self.pool)
        self.runner = ModelRunner(loaded.model, ops, self.device, self.dtype, num_blocks,
                                  config.block_size, self.max_model_len,
                                  not config.enforce_eager, backend == "triton",
                                  overlap=config.async_scheduling,
                                  max_graph_batch=max(config.scheduler.max_num_seqs, 256))
        self.sampler = Sampler(self.device, config.seed)
        self.stats = StatsRecorder()
        self._ids = itertools.count()
        self._detok: dict[str, IncrementalDetokenizer] = {}
        self._chunks_done: dict[str, int] = {}
        self.requests: dict[str, Request] = {}     # unfinished, by id
        self._inflight: overlap.Launched | None = None   # overlapped step awaiting its tokens
        self.allow_chain = True                    # the loop turns overlap off while paused
        self.recent_finished: deque = deque(maxlen=256)

    def _blocks_from_memory(self, model) -> int:
        if self.device.type != "cuda":
            return CPU_DEFAULT_BLOCKS
        free, total = torch.cuda.mem_get_info(self.device)
        per_block = ModelRunner.kv_bytes_per_block(model, self.config.block_size, self.dtype)
        reserve = 2 * 1024 ** 3  # activations, logits, CUDA graphs
        budget = total * self.config.gpu_memory_utilization - (total - free) - reserve
        return max(16, int(budget // per_block))

    # -- knobs -----------------------------------------------------------------------
    @property
    def knobs(self) -> SchedulerConfig:
        return self.scheduler.knobs

    def set_knobs(self, knobs: SchedulerConfig) -> None:
        self.scheduler.knobs = knobs

    # -- requests ----------------------------------------------------------------------
    def make_request(self, prompt, params: SamplingParams | None = None,
                     request_id: str | None = None, arrival_time: float | None = None) -> Request:
        """Tokenize and validate (safe from any thread: touches no scheduler state)."""
        params = params if params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError("params must be a SamplingParams")
        text, ids = self._tokenize(prompt)
        self._validate_ids(ids, params)
        if params.stop and self.tokenizer is None:
            raise InvalidRequestError(f"model {self.model_name!r} has no tokenizer: stop strings "
                                      "can never match (use stop_token_ids)")
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        req = Request(rid, ids, params, prompt=text)
        if arrival_time is not None:
            req.arrival_time = arrival_time
        return req

    def _tokenize(self, prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" not in prompt:
                raise InvalidRequestError("a dict prompt needs 'prompt_token_ids'")
            ids = prompt["prompt_token_ids"]
            if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
                raise InvalidRequestError("prompt_token_ids must be a list of integers, got "
                                          f"{type(ids).__name__}")
            return prompt.get("prompt"), list(ids)
        if isinstance(prompt, (list, tuple)):
            return None, list(prompt)
        if not isinstance(prompt, str):
            raise InvalidRequestError(f"prompt must be a string or token ids, got {type(prompt).__name__}")
        if not prompt:
            raise InvalidRequestError("prompt is empty")
        if self.tokenizer is None:
            raise InvalidRequestError(f"model {self.model_name!r} has no tokenizer: pass "
                                      "{'prompt_token_ids': [...]} instead of text")
        return prompt, self.tokenizer.encode(prompt)

    def _validate_ids(self, ids: list[int], params: SamplingParams) -> None:
        if not ids:
            raise InvalidRequestError("prompt is empty (0 tokens)")
        if any(isinstance(t, bool) or not isinstance(t, int) for t in ids):
            raise InvalidRequestError("prompt_token_ids must be integers")
        if min(ids) < 0 or max(ids) >= self.vocab_size:
            raise InvalidRequestError(f"token ids must be in [0, {self.vocab_size}); got "
                                      f"min {min(ids)}, max {max(ids)}")
        if len(ids) >= self.max_model_len:
            raise InvalidRequestError(f"prompt has {len(ids)} tokens; max_model_len is "
                                      f"{self.max_model_len} (prompt must leave room for 1 token)")
        need = min(len(ids) + params.max_tokens, self.max_model_len)
        capacity = self.pool.num_blocks * self.pool.block_size
        if need > capacity:
            raise InvalidRequestError(f"prompt + max_tokens = {need} tokens can never fit the "
                                      f"KV pool ({self.pool.num_blocks} blocks x "
                                      f"{self.pool.block_size} = {capacity} tokens)")

    def add(self, req: Request) -> None:
        if req.request_id in self.requests:
            raise InvalidRequestError(f"duplicate request id {req.request_id!r}")
        self.requests[req.request_id] = req
        self._detok[req.request_id] = IncrementalDetokenizer(self.tokenizer, req.params.stop)
        self.scheduler.add(req)

    def add_request(self, prompt, params: SamplingParams | None = None, **kw) -> Request:
        req = self.make_request(prompt, params, **kw)
        self.add(req)
        return req

    def abort(self, request_id: str, reason: str = "cancelled",
              error: str | None = None) -> Request | None:
        """End a request at any stage (waiting, prefilling, decoding, preempted)."""
        req = self.requests.get(request_id)
        if req is None:
            return None
        status = RequestStatus.ERROR if reason == "error" else RequestStatus.CANCELLED
        self._finish(req, status, reason, error)
        return req

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def clear_prefix_cache(self) -> int:
        return self.scheduler.clear_prefix_cache()

    # -- the step ------------------------------------------------------------------------
    def step(self) -> list[Request]:
        """Run one engine step; return the requests that got tokens or finished.

        With overlap, a call may launch the next decode step before returning the tokens
        of the previous one (see engine/overlap.py)."""
        if self._inflight is not None:
            return self._complete_inflight(chain=True)
        t0, evictions0 = time.perf_counter(), self.pool.evictions
        plan = self.scheduler.schedule()
        if not plan:
            self._record(plan, t0, evictions0, 0)
            return []
        try:
            launched = overlap.launch(self, plan)
            if overlap.chainable(self, plan):
                self._inflight = launched
                return []
            self._commit(plan)
            touched = self._emit_tokens(launched)
        except Exception as exc:  # a failing forward fails its requests, not the engine
            touched = self._fail_plan(plan, exc)
        self._after_step(plan, t0, evictions0, touched)
        return touched

    def flush(self) -> list[Request]:
        """Finish an in-flight overlapped step without launching another."""
        return self._complete_inflight(chain=False) if self._inflight is not None else []

    def _complete_inflight(self, chain: bool) -> list[Request]:
        prev, self._inflight = self._inflight, None
        try:
            self._commit(prev.plan)
            nxt = overlap.next_plan(self, prev) if chain else None
            if nxt is not None:
                self._inflight = overlap.launch(self, *nxt)
            touched = self._emit_tokens(prev)
        except Exception as exc:
            touched = self._fail_plan(prev.plan, exc)
            if self._inflight is not None:
                touched += self._fail_plan(self._inflight.plan, exc)
                self._inflight = None
        self._after_step(prev.plan, prev.t0, prev.evictions0, touched)
        return touched

    def _after_step(self, plan: StepPlan, t0: float, evictions0: int, touched) -> None:
        if self.config.check_invariants:
            self.check_invariants()
        self._record(plan, t0, evictions0, sum(1 for r in touched if r.token_times))

    def _commit(self, plan: StepPlan) -> None:
        """The plan's KV is computed: advance counters, index newly full blocks, and let
        dedup followers take the blocks of leaders that finished their prompt."""
        page, running = self.pool.block_size, RequestStatus.RUNNING
        for c in plan.decodes:   # hot loop: one token each; a block fills every `page`
            req = c.request
            if req.status is running:
                req.num_computed_tokens += 1
                if req.num_computed_tokens % page == 0:
                    self.kv_register(req)
        for c in plan.prefills:
            req = c.request
            if req.status.done:
                continue
            req.num_computed_tokens += c.num_tokens
            self.kv_register(req)
            self._chunks_done[req.request_id] = self._chunks_done.get(req.request_id, 0) + 1
            if c.sample:
                self.scheduler.leader_sampled(req)

    def _emit_tokens(self, launched: "overlap.Launched") -> list[Request]:
        tokens = launched.host_tokens.tolist()     # the step's one host sync
        now = time.perf_counter()
        touched = []
        for req, token in zip(launched.requests, tokens):
            if req.status is RequestStatus.RUNNING:   # not cancelled meanwhile
                self._append_token(req, token, now)
                touched.append(req)
        return touched

    def kv_register(self, req: Request) -> None:
        self.scheduler.kv.register_full_blocks(req, self.knobs.enable_prefix_caching)

    def _append_token(self, req: Request, token: int, now: float) -> None:
        req.output_token_ids.append(token)
        times = req.token_times
        times.append(now)
        if len(times) > 1:
            self.stats.recent_itls.append((now, now - times[-2]))
        p = req.params
        hit_stop = False
        if self.tokenizer is not None:
            req.text, hit_stop = self._detok[req.request_id].step(req.output_token_ids, req.text)
        if hit_stop or token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids):
            self._finish(req, RequestStatus.FINISHED, "stop")
        elif len(req.output_token_ids) >= p.max_tokens or req.num_tokens >= self.max_model_len:
            self._finish(req, RequestStatus.FINISHED, "length")

    def _finish(self, req: Request, status: RequestStatus, reason: str, error: str | None = None) -> None:
        self.scheduler.remove(req)
        req.status, req.finish_reason, req.error = status, reason, error
        del self.requests[req.request_id]
        self._detok.pop(req.request_id, None)
        self.recent_finished.append(request_view(req, self._chunks_done.pop(req.request_id, 0)))
        self.stats.on_finish(req)

    def _fail_plan(self, plan: StepPlan, exc: Exception) -> list[Request]:
        msg = f"{type(exc).__name__}: {exc}"
        failed = []
        for c in plan.chunks:
            req = c.request
            if req.request_id in self.requests:
                for f in list(self.scheduler.followers.get(req, ())):
                    self._finish(f, RequestStatus.ERROR, "error", msg)
                    failed.append(f)
                self._finish(req, RequestStatus.ERROR, "error", msg)
                failed.append(req)
        for req in list(self.scheduler.running):   # followers that took a leader's blocks
            if req.dedup_leader is None and req.num_uncomputed < 1:   # but not its token:
                self._finish(req, RequestStatus.ERROR, "error", msg)  # never schedulable
                failed.append(req)
        self.stats.last_error = msg
        return failed

    def _record(self, plan: StepPlan, t0: float, evictions0: int, sampled: int) -> None:
        now = time.perf_counter()
        chunks = tuple(ChunkInfo(c.request.request_id, c.start, c.num_tokens,
                                 c.request.num_prefill_target) for c in plan.prefills)
        step = StepStats(self.stats.counters.steps, now, now - t0, len(plan.decodes),
                         sum(c.num_tokens for c in plan.prefills), chunks,
                         plan.prefix_hit_blocks, len(plan.copies),
                         self.pool.evictions - evictions0, len(plan.preempted), plan.dedup_joined,
                         len(self.scheduler.running), len(self.scheduler.waiting), sampled)
        self.stats.on_step(step, bool(plan), self.pool)

    def check_invariants(self) -> None:
        self.pool.check(self.scheduler.block_tables())

    def snapshot(self, paused: bool = False) -> EngineSnapshot:
        """An immutable view of the engine now (cheap: arrays copied, views built)."""
        st = self.stats
        active = tuple(request_view(r, self._chunks_done.get(rid, 0))
                       for rid, r in self.requests.items())
        return EngineSnapshot(
            time=time.perf_counter(), step=st.counters.steps, model=self.model_name,
            device=str(self.device), dtype=str(self.dtype).removeprefix("torch."),
            knobs=self.knobs, paused=paused, num_blocks=self.pool.num_blocks,
            block_size=self.pool.block_size, block_state=self.pool.states(),
            block_refcount=self.pool.refcounts.copy(),
            requests=active + tuple(self.recent_finished), last_step=st.last_step,
            recent_steps=tuple(st.recent_steps), counters=st.counters,
            recent_latencies=tuple(st.recent_latencies), recent_itls=tuple(st.recent_itls),
            error=st.last_error,
            extra={"peak_used_blocks": st.peak_used_blocks, "backend": self.backend,
                   "max_model_len": self.max_model_len, "forward_calls": self.runner.forward_calls})
