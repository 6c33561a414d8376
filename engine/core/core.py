"""LLMEngine: the engine core. One thread owns it; it only schedules and steps.

add(CoreRequest) -> step() repeatedly -> StepOutput (new token ids, finished requests).
A step: Scheduler.schedule() -> StepPlan -> build_step_batch() -> StepBatch ->
Executor.execute_model() (the model side: engine/worker/executor/) -> tokens -> update
(append, finish by stop token / length, free blocks) -> stats, events. Text is the
front's business (engine/front/processor.py): the core sees token ids only.
Async scheduling (the `async_scheduling` knob): engine/core/async_steps.py. A failed
step: engine/core/step_faults.py.
"""
from __future__ import annotations

import dataclasses
from collections import deque

from engine.core.batch_builder import build_step_batch
from engine.core.launched import Launched, commit_plan
from engine.core.prompt_logprobs import take_prompt_logprobs
from engine.core.clock import ServingClock
from engine.codes import REASON_CANCELLED, REASON_ERROR, REASON_LENGTH, REASON_STOP
from engine.config import EngineConfig, InvalidRequestError, SchedulerConfig, SpeculativeConfig
from engine.core.async_steps import AsyncSteps
from engine.core.events import EventLog
from engine.core.step_faults import StepFaults
from engine.block_hash import stable_block_hash
from engine.core.kv.block_pool import BlockPool
from engine.core.kv.host_tier import HostTier
from engine.core.kv.kv_events import KVEventRecorder
from engine.outputs import CoreRequest, FinishedRequest, StepOutput
from engine.request import Request, RequestStatus, append_sampled, attach_logprobs
from engine.core.scheduler import Scheduler
from engine.core.step_plan import StepPlan
from engine.core.spec_decode import Proposer, SpecDecoder, make_proposer
from engine.core.structured import make_manager
from engine.worker.executor import Executor, build_executor
from engine.core.kv.counters import Counters
from engine.core.views import engine_snapshot, request_view
from engine.snapshot import EngineSnapshot
from engine.core.stats import StatsRecorder
from engine.core.steady_decodes import append_steady
from engine.core.token_trace import build_trace

# finished requests a snapshot still shows: re-sent in every snapshot, so few; and the
# latest RECENT_TRACED that asked for their trace (SamplingParams.token_trace: a viewer's
# own prompts), shown beside them however many others ended since
RECENT_FINISHED, RECENT_TRACED = 64, 16
_STATUS = {REASON_STOP: RequestStatus.FINISHED, REASON_LENGTH: RequestStatus.FINISHED,
           REASON_CANCELLED: RequestStatus.CANCELLED, REASON_ERROR: RequestStatus.ERROR}


class LLMEngine(AsyncSteps, StepFaults):
    def __init__(self, config: EngineConfig, proposer: Proposer | None = None):
        """proposer: where speculative drafts come from instead of the configured method's
        (the Python API's extension point: docs/SPECULATIVE.md "Proposers")."""
        self.config = config
        self.executor: Executor | None = None
        try:
            self.executor = build_executor(config)    # the model side: loads the model
            self._build(config, self.executor, proposer)
        except BaseException:
            self.close()
            raise

    def _build(self, config: EngineConfig, executor: Executor,
               proposer: Proposer | None) -> None:
        self.model_name, self.backend = executor.model_name, executor.backend
        self.device, self.dtype = executor.device, executor.dtype    # (as the caller sees them)
        self.tokenizer = executor.tokenizer     # loaded with the model, for the front only
        self.eos_token_ids = frozenset(executor.eos_token_ids)
        self.vocab_size = executor.vocab_size
        self.max_model_len = executor.max_model_len
        self.counters = Counters()
        self.events = EventLog()
        self.pool = BlockPool(executor.num_blocks, config.block_size, self.counters)
        # KV events (kv_events_config): a recorder, and hashes every process agrees on;
        # its sink (the publisher) is attached by whoever runs the engine
        self.kv_events: KVEventRecorder | None = None
        if config.kv_events_enabled:
            self.kv_events = self.pool.kv_events = KVEventRecorder()
            self.pool.hash_fn = stable_block_hash
        self.clock = ServingClock()
        self.pool.clock = self.clock.now          # block lifetimes on the serving clock
        host_kv = executor.host_kv                # the host tier (kv_offloading_size)
        self.host = host_kv and HostTier(host_kv.num_blocks, self.pool, host_kv.bytes_per_block
                                         * config.tensor_parallel_size, self.counters)
        if self.host:
            self.host.timer = executor.kv_copy_seconds
        self.scheduler = Scheduler(config.scheduler, self.pool, self.counters, self.host)
        self.scheduler.max_model_len = self.max_model_len
        spec = config.speculative_config or SpeculativeConfig()
        self.spec = SpecDecoder(proposer or make_proposer(spec, executor.draft),
                                self.scheduler, self.counters, spec.disable_by_batch_size)
        self.scheduler.drafter = self.spec.schedule_drafts
        self.structured = make_manager(config, self.tokenizer, self.vocab_size,
                                       executor.eos_token_ids,
                                       executor.device_type == "cuda", self.counters)
        self.spec.check_drafts = self.structured.validate_drafts
        self.async_scheduling_enabled = config.async_scheduling
        self.stats = StatsRecorder(self.counters)
        self.requests: dict[str, Request] = {}     # unfinished, by id
        self.async_scheduling = self.async_scheduling_enabled   # off while paused (CoreLoop)
        self._inflight: Launched | None = None
        self._chained = 0          # steps launched in a row before their previous one's
        #                            tokens were read, while speculating (_may_chain)
        # each an ended Request until a snapshot views it (views.ended_views), then its
        # RequestView: a finishing step builds none (W1's end 16 a step, mostly unseen)
        self.recent_finished: deque = deque(maxlen=RECENT_FINISHED)
        self.recent_traced: deque = deque(maxlen=RECENT_TRACED)
        self._retired: list = []   # ended requests past those windows: freed at the
        #                            next launch (~10 us each: 512 prompt ids, its times)

    # -- knobs and requests --------------------------------------------------------------
    @property
    def knobs(self) -> SchedulerConfig:
        return self.scheduler.knobs

    def set_knobs(self, knobs: SchedulerConfig) -> None:
        self.scheduler.knobs = knobs

    @property
    def speculating(self) -> bool:
        """Speculative decoding is on (the live knob's k > 0)."""
        return self.scheduler.knobs.num_speculative_tokens > 0

    def add(self, creq: CoreRequest) -> Request:
        """Queue a validated request (engine/front/processor.py validated it in the front)."""
        if creq.request_id in self.requests:
            raise InvalidRequestError(f"duplicate request id {creq.request_id!r}")
        ids = creq.prompt_token_ids     # a tuple is kept as it is (Request.prompt_token_ids)
        req = Request(creq.request_id, ids if type(ids) is tuple else list(ids), creq.params,
                      prompt=creq.prompt_preview,
                      arrival_time=self.clock.to_serving(creq.arrival_time),
                      priority=creq.priority)
        p = creq.params
        req.stop_ids = frozenset(p.stop_token_ids) | (frozenset() if p.ignore_eos
                                                      else self.eos_token_ids)
        self.requests[req.request_id] = req
        # structured outputs: queued once its grammar is compiled (a cache hit: now)
        if p.structured_outputs is None or self.structured.add(req):
            self.scheduler.add(req)
        return req

    def abort(self, request_id: str, reason: str = REASON_CANCELLED,
              error: str | None = None, out: StepOutput | None = None) -> Request | None:
        """End a request at any stage (waiting, prefilling, decoding, preempted)."""
        req = self.requests.get(request_id)
        if req is not None:
            self._finish(req, reason, error, out)
        return req

    def abort_output(self, request_id: str, reason: str = REASON_CANCELLED,
                     error: str | None = None) -> StepOutput:
        """abort(), with the request's end as a StepOutput for the front (empty if the
        request is unknown or already over)."""
        out = StepOutput()
        self.abort(request_id, reason, error, out)
        return out

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def clear_prefix_cache(self) -> int:
        """Forget every cached prefix, in both tiers; the blocks cleared (the host's
        first: its KV events remove its blocks, then AllBlocksCleared the device's)."""
        n = (self.host.clear() if self.host else 0) + self.pool.clear_cache()
        if self.kv_events is not None:
            self.kv_events.flush()
        return n

    # -- the step ------------------------------------------------------------------------
    def step(self) -> StepOutput:
        """Run one engine step; return its new tokens and finished requests. With async
        scheduling a call launches the next step before returning this one's tokens.
        Requests whose grammar compiled join the queue first; those whose compile failed
        or timed out end (structured outputs)."""
        failed = self.structured.poll(self.scheduler.add) if self.structured.compiling else ()
        out = self._step()
        for req, error in failed:
            if req.request_id in self.requests:
                self._finish(req, REASON_ERROR, error, out)
        return out

    def _step(self) -> StepOutput:
        if self._inflight is not None:
            return self._complete_inflight(chain=True)
        t0 = self.clock.now()
        plan = self._schedule()
        out = StepOutput()
        self._chained = 0
        if not plan:
            self._record(plan, t0, 0)
            if self.structured.compiling:    # nothing to run but grammars to wait for
                self.structured.wait(0.01)
            return out
        try:
            launched = self._launch(plan)
        except Exception as exc:  # a failing forward fails its requests, not the engine
            self._isolate(plan, exc, out)
            self._after_step(plan, t0, out)
            return out
        if self.async_scheduling:     # (a verify too: engine/core/async_steps.py)
            self._inflight = launched
            return out
        try:
            self._commit(plan)
            self._emit_tokens(launched, out)
        except Exception as exc:  # after the commit began: no rerun
            self._fail_plan(plan, exc, out)
        self._after_step(plan, t0, out)
        return out

    def flush(self) -> StepOutput:
        """Finish an in-flight step without launching another."""
        return self._complete_inflight(chain=False) if self._inflight is not None else StepOutput()

    def _schedule(self) -> StepPlan:
        """The scheduler's plan, with the host tier's copies it needs sent to every rank
        before its forward (a failed send fails the plan's requests when it launches)."""
        plan = self.scheduler.schedule()
        if self.host is not None:
            try:
                plan.tier_step = self.host.send(self.executor)
            except Exception as exc:
                plan.kv_error = exc
        return plan

    def _launch(self, plan: StepPlan, device_fed: bool = False) -> Launched:
        """Build the plan's batch and queue its forward and sampling on every rank (the
        decodes whose tokens are pending read them from the last samples, on the device)."""
        if plan.kv_error is not None:
            raise plan.kv_error
        t0 = self.clock.now()
        batch, requests = build_step_batch(plan, self.scheduler.followers, self.pool.block_size,
                                           self.scheduler.kv.tables, device_fed)
        grammar = self.structured.step_mask(requests, plan, batch.draft_rows) \
            if self.structured.active else None
        if grammar is not None:
            batch = dataclasses.replace(batch, grammar=grammar.mask)
        ex = self.executor
        try:
            tokens = ex.execute_model(batch)   # copying to the host; None: sampled once masked
            kept = plan.decode_columns    # a steady decode step's rows: the kept columns'
            admits = kept.admits if kept is not None and len(kept.admits) == len(requests) \
                else [r.admit_seq for r in requests]
            launched = Launched(plan, batch, requests, admits, tokens, t0,
                                None if tokens is None else ex.take_logprobs(batch),
                                take_prompt_logprobs(ex, plan), grammar)
        except Exception:
            ex.rewind_draws()     # its requests run again (_isolate): draws as never made
            raise
        self._retired.clear()      # freed while the device runs the step
        return launched

    def _after_step(self, plan: StepPlan, t0: float, out: StepOutput) -> None:
        if self.config.check_invariants:
            self.check_invariants()
        self._record(plan, t0, len(out.request_ids))

    def _commit(self, plan: StepPlan, rows: list[Request] | None = None) -> bool:
        """commit_plan; rows: the plan's sample rows, whose tokens to count as pending
        in the same pass where it can (returns whether it did)."""
        return commit_plan(plan, self.scheduler, self.pool.block_size,
                           self.knobs.enable_prefix_caching, rows)

    def _emit_tokens(self, launched: Launched, out: StepOutput) -> None:
        tokens, waited = launched.host_tokens.wait_seconds()   # the step's one host sync
        self.counters.device_wait_us += int(waited * 1e6)
        now = out.time = self.clock.now()
        requests, verifies, admits = launched.requests, launched.plan.verifies, launched.admits
        if launched.prompt_logprobs is not None:
            launched.prompt_logprobs.deliver(out)
        row_logprobs = None
        if launched.logprobs is not None or out.logprobs is not None:
            row_logprobs = out.align_logprobs(launched.logprobs, requests)
        step_logprobs = row_logprobs           # by sample row (the grammar views read them)
        if verifies:     # the verified positions' sample rows: one range (batch_builder)
            lo = int(launched.batch.draft_rows[0])
            hi = lo + launched.batch.draft_rows.shape[0]
            verified = tokens[lo:hi]
            requests, tokens = requests[:lo] + requests[hi:], tokens[:lo] + tokens[hi:]
            admits = admits[:lo] + admits[hi:]
            if row_logprobs is not None:
                row_logprobs = row_logprobs[:lo] + row_logprobs[hi:]
        kept = launched.plan.decode_columns
        d = 0 if kept is None or not self.scheduler.steady_rows(launched.plan) \
            else len(kept.requests)
        if d:       # its decode rows (no verifies: none kept), then its prompts' rows
            ended = append_steady(kept, tokens[:d], now, self.stats.recent_itls,
                                  out.request_ids, out.token_ids)
            rest_lp = None
            if row_logprobs is not None:
                attach_logprobs(kept.requests, row_logprobs[:d], out.logprobs)
                rest_lp = row_logprobs[d:]
            if len(requests) > d:
                ended += append_sampled(requests[d:], tokens[d:], now, self.stats.recent_itls,
                                        out.request_ids, out.token_ids, rest_lp, out.logprobs,
                                        admits[d:])
        else:
            ended = append_sampled(requests, tokens, now, self.stats.recent_itls,
                                   out.request_ids, out.token_ids, row_logprobs,
                                   out.logprobs, admits)
        if verifies:
            ended += self.spec.commit(launched.plan, verified, now, self.stats.recent_itls, out,
                                      self.knobs.enable_prefix_caching)
        ended = [(r, reason, None) for r, reason in ended]
        if launched.grammar is not None:     # matchers consume the new tokens
            done = {id(r) for r, _, _ in ended}
            ended += [e for e in self.structured.advance(launched.grammar, step_logprobs)
                      if id(e[0]) not in done]
        self._finish_all(ended, out)

    def _redraw_first(self, req: Request) -> None:
        """A request sent back before its first token was emitted draws that token
        afresh, as alone: a lost step's draw had advanced its seeded generator (and
        penalty counts), so its sampler state goes."""
        if not req.output_token_ids:
            self.executor.release(req.request_id)

    def _finish(self, req: Request, reason: str, error: str | None,
                out: StepOutput | None) -> None:
        self._finish_all(((req, reason, error),), out)

    def _finish_all(self, ended, out: StepOutput | None) -> None:
        """End each (request, reason, error) in turn; their blocks are freed together,
        once every one has left the scheduler, and then each one's view, stats and
        output are made (a W1 finishing step ends 16 requests of ~40 blocks each)."""
        dropped = []
        for req, reason, error in ended:
            req.drop_pending()
            followers = self.scheduler.followers.get(req)
            followers = list(followers) if followers else ()
            if req.grammar is None or not self.structured.release(req):
                self.scheduler.unlink(req)   # (a request still compiling never entered it)
                dropped.append(req)
            for f in followers:   # sent back to the queue: a row of theirs in a step in flight
                self._redraw_first(f)   # drew from their generators for a token never emitted
            req.status, req.finish_reason, req.error = _STATUS[reason], reason, error
            del self.requests[req.request_id]
            self.executor.release(req.request_id)
            self.spec.release(req.request_id)
        if dropped:
            self.scheduler.kv.drop_all(dropped)
        for req, reason, error in ended:
            # a grammar's view may still change (the step in flight's row): viewed now
            shown = req if req.grammar is None else request_view(req)
            for window in (self.recent_finished, self.recent_traced) \
                    if req.params.token_trace else (self.recent_finished,):
                if len(window) == window.maxlen:
                    self._retired.append(window[0])
                window.append(shown)
            trace = build_trace(req)
            self.stats.on_finish(req, trace)
            if out is not None:
                out.finished.append(FinishedRequest(
                    req.request_id, reason, error, req.arrival_time, req.num_cached_tokens,
                    req.num_preemptions, req.num_host_cached_tokens,
                    trace if req.params.token_trace else None, req.scheduled_ts))

    def _record(self, plan: StepPlan, t0: float, sampled: int) -> None:
        sched, now = self.scheduler, self.clock.now()
        evicted = self.pool.take_evicted()
        self.stats.on_step(plan, t0, now, sampled, len(sched.running), len(sched.waiting),
                           len(evicted), self.pool)
        if plan:
            self.events.record(self.counters.steps, now, plan, evicted, self.pool.block_size)
        if self.kv_events is not None:
            self.kv_events.flush()

    def close(self) -> None:
        """Stop the grammar compiles and close the executor (its CUDA graphs, the
        tensor-parallel workers); idempotent."""
        if getattr(self, "structured", None) is not None:
            self.structured.close()
        if self.executor is not None:
            self.executor.close()

    def check_invariants(self) -> None:
        self.pool.check(self.scheduler.block_tables())
        self.scheduler.kv.tables.check(self.scheduler.running)
        self.scheduler.check_columns()
        if self.host is not None:
            self.host.check([r for r in self.scheduler.waiting if r.swap is not None])

    def snapshot(self, paused: bool = False) -> EngineSnapshot:
        """An immutable view of the engine now (cheap: arrays copied, views built)."""
        return engine_snapshot(self, paused)
