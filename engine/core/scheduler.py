"""The scheduler: what one step computes, under the live knobs.

Step composition (`scheduling_mode`):
  budget         one token for every running decode (oldest first; more decodes than
                 the budget take turns), then prefill chunks under what is left of
                 max_num_batched_tokens: running mid-prefill requests, then waiting ones,
                 each chunk = min(tokens still needed, budget left) (vLLM V1).
  prefill-first  a step of prefill chunks alone whenever any can be scheduled, else a
                 step of decodes alone (nano-vllm; SGLang without mixed chunks).
  mixed-chunk    every running decode in every step, uncapped, and prefill chunks under
                 the budget minus the decodes (SGLang --enable-mixed-chunk).
Admission walks the waiting queue in the `scheduling_policy` order (engine/core/sched_policy.py)
and stops at the first request that does not fit (no overtaking). When the pool runs
dry for a running request, a victim is preempted (blocks freed, requeued at the front,
recomputed; under preemption_mode=swap its blocks are first copied to the host tier and
copied back when it is re-admitted): the newest, or under `priority` the least
important. Identical prompts
are prefilled once: later copies wait on the first ("leader") and share its blocks and
last-token logits when it samples.

Async scheduling plans a step while the previous one is still on the device: a request
that step samples already counts its token (request.add_pending_tokens), so it is scheduled as
a decode whose input the runner takes from the device; one that this token ends by
length is left out, and a preempted one is not re-admitted before the token is read.
"""
from __future__ import annotations

from collections import deque

from engine.config import SchedulerConfig
from engine.core.kv.block_pool import BlockPool
from engine.core.kv.host_tier import HostTier
from engine.core.kv.kv_manager import KVManager
from engine.request import Request, RequestStatus
from engine.core.sched_policy import admission_order, running_order, victim_key
from engine.core.kv.counters import Counters
from engine.core.decode_scheduling import DecodeScheduling
from engine.core.steady_decodes import MIN_DECODES, DecodeColumns
from engine.core.step_plan import ScheduledChunk, StepPlan


class Scheduler(DecodeScheduling):
    def __init__(self, knobs: SchedulerConfig, pool: BlockPool, counters: Counters,
                 host: HostTier | None = None):
        self.pool = pool
        self.kv = KVManager(pool, host)
        self.knobs = knobs
        self.counters = counters
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.followers: dict[Request, list[Request]] = {}   # dedup leader -> waiters
        self._leaders: dict[tuple, Request] = {}            # prompt key -> leader
        self._admit_counter = 0
        self._decode_offset = 0
        self.max_model_len = 1 << 62     # the engine sets its own
        # speculative decoding (engine/core/spec_decode.py): (plan, budget) -> budget left;
        # turns scheduled decodes into VerifyChunks while num_speculative_tokens > 0
        self.drafter = None
        self._steady: DecodeColumns | None = None   # the last plan's, if it decoded every
        #                                  running request (engine/core/steady_decodes.py)
        self._steady_plan: StepPlan | None = None   # that plan
        self._pending_plan: StepPlan | None = None  # the last plan committed with every
        #                                  decode's token pending (decodes_pending)
        self._pending_gone: list[int] = []  # its rows of requests that ended meanwhile
        self._pending_joined: list = []     # its prompts' (row, request): decode next

    @property
    def knobs(self) -> SchedulerConfig:
        return self._knobs

    @knobs.setter
    def knobs(self, knobs: SchedulerConfig) -> None:
        """The live knobs, swapped whole; the pool's eviction follows them from now on
        (every allocation evicts by it: admissions and continuations alike), and so does
        the host tier's (and its stores and lookups follow prefix caching)."""
        self._knobs = knobs
        self.pool.eviction_policy = knobs.eviction_policy
        if self.kv.host is not None:
            self.kv.host.follow(knobs)

    # -- queue operations (engine thread) ------------------------------------------
    def add(self, req: Request) -> None:
        req.length_cap = min(req.length_cap, self.max_model_len)
        self.waiting.append(req)

    def unlink(self, req: Request) -> None:
        """Take a request out (finished, cancelled, failed) but for its blocks, which the
        caller frees once every request the step ends is out (KVManager.drop_all: their
        blocks together)."""
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
        elif req.status is RequestStatus.WAITING:
            self.waiting.remove(req)
        self._drop_links(req)

    # -- the step plan ---------------------------------------------------------------
    def schedule(self) -> StepPlan:
        knobs = self.knobs
        plan = StepPlan(budget=knobs.max_num_batched_tokens, mode=knobs.scheduling_mode)
        order = running_order(self.running, knobs.scheduling_policy)
        # the kept columns step on only from the plan committed last with every
        # decode's token pending
        steady = self._steady if self._steady_plan is self._pending_plan else None
        self._steady = self._steady_plan = None
        decodes, fast, prefilling, columns = self._partition(order, steady, self._pending_gone,
                                                             self._pending_joined)
        self._plan(plan, decodes, fast, prefilling, knobs)
        if len(order) >= MIN_DECODES:       # narrower steps keep none (steady_decodes.py)
            self._keep_columns(plan, order, columns)
        return plan

    def _plan(self, plan: StepPlan, decodes: list[Request], fast: list[bool] | None,
              prefilling: list[Request], knobs: SchedulerConfig) -> None:
        budget = plan.budget
        if knobs.scheduling_mode == "prefill-first":
            # a prefill never preempts here: one that did could be re-admitted at once
            # and starve every decode (a prefill-only step each time, forever)
            left = self._schedule_running_prefills(plan, prefilling, budget, may_preempt=False)
            self._admit_waiting(plan, left, knobs)
            if not plan.prefills:
                self._add_drafts(plan, self._schedule_decodes(plan, decodes, fast, budget))
            if not plan:       # nothing fits without preempting: the oldest prefill may
                self._schedule_running_prefills(plan, prefilling, budget)
            return
        if knobs.scheduling_mode == "mixed-chunk" or len(self.running) <= budget:
            self._schedule_decodes(plan, decodes, fast, None)   # every decode: no turns
            budget = max(0, budget - len(plan.decodes))
        else:
            budget = self._schedule_decodes(plan, decodes, fast, budget)
        budget = self._add_drafts(plan, budget)
        budget = self._schedule_running_prefills(plan, prefilling, budget)
        self._admit_waiting(plan, budget, knobs)

    def _add_drafts(self, plan: StepPlan, budget: int) -> int:
        """Drafts for the scheduled decodes, from what is left of the token budget."""
        if self.drafter is None or not self.knobs.num_speculative_tokens or not plan.decodes:
            return budget
        return self.drafter(plan, budget)

    def _schedule_running_prefills(self, plan: StepPlan, prefilling: list[Request], budget: int,
                                   may_preempt: bool = True) -> int:
        for req in prefilling:
            if budget == 0:
                break
            if req.status is not RequestStatus.RUNNING:
                continue
            n = min(req.num_uncomputed, budget)
            if not (self._reserve_running(req, n, plan) if may_preempt
                    else self.kv.reserve(req, n, plan.copies)):
                continue
            plan.prefills.append(self._chunk(req, n))
            budget -= n
        return budget

    def _admit_waiting(self, plan: StepPlan, budget: int, knobs: SchedulerConfig) -> None:
        caching = knobs.enable_prefix_caching
        if not self.waiting or len(self.running) >= knobs.max_num_seqs:
            return
        order = admission_order(self.waiting, knobs.scheduling_policy,
                                self.kv.cached_prefix_blocks if caching else None)
        for req in order:
            swapped = req.swap
            if len(self.running) >= knobs.max_num_seqs or req.num_pending \
                    or (swapped is not None and not swapped.settled):
                break      # (a preempted request's last token or its swap-out in flight)
            # prompt_logprobs needs every prompt position's logits: no prefix hit, no dedup
            cache = caching and req.prompt_logprobs is None and swapped is None
            if cache and self._join_leader(req, plan):
                continue
            if budget == 0:
                break
            hits = 0
            if swapped is not None:
                self.kv.restore_swapped(req)
            elif cache:
                hits = self.kv.lookup_prefix(req)
            n = min(req.num_uncomputed, budget)
            if not self.kv.reserve(req, n, plan.copies):
                self.kv.free(req)   # undo the prefix hit; wait for blocks (no overtaking)
                break
            if swapped is not None:
                self.kv.host.swap_in(req)
            self.waiting.remove(req)
            self._start(req, hits, resumed=swapped is not None)
            if cache:
                self._leaders.setdefault(req.prompt_key, req)   # set by _join_leader
            if hits:
                plan.prefix_hits.append((req.request_id, tuple(req.block_table[:hits])))
            plan.prefills.append(self._chunk(req, n))
            budget -= n

    # -- helpers -----------------------------------------------------------------------
    def _chunk(self, req: Request, n: int) -> ScheduledChunk:
        start = req.num_computed_tokens
        sample = start + n == req.num_tokens
        if not req.token_times:       # its prompt, before its first token: the TTFT split
            req.prefill_chunks += 1
            if sample:
                req.last_chunk_ts = self.pool.clock()
                req.prefill_preemptions = req.num_preemptions
        return ScheduledChunk(req, start, n, sample)

    def _start(self, req: Request, hit_blocks: int, resumed: bool = False) -> None:
        """Admit: running from now. A swapped-out request resumes (its cached tokens as
        they were); another counts the prefix hits of this admission."""
        if req.scheduled_ts is None:  # the first admission counts (vLLM's scheduled_ts)
            req.scheduled_ts = self.pool.clock()
        req.status = RequestStatus.RUNNING
        req.admit_seq = self._admit_counter
        self._admit_counter += 1
        if not resumed:
            req.num_cached_tokens = hit_blocks * self.pool.block_size
            if not hit_blocks:
                req.num_host_cached_tokens = 0
        req.num_prefill_target = req.num_tokens
        self.running.append(req)

    @staticmethod
    def _prompt_key(req: Request) -> tuple:
        ids = req.prompt_token_ids       # (a submitted prompt's tuple: hashed as it is)
        if req.output_token_ids or type(ids) is not tuple:
            ids = tuple(req.all_token_ids())
        return (req.num_tokens, hash(ids))

    def _join_leader(self, req: Request, plan: StepPlan) -> bool:
        """Same-prompt dedup: wait on a running request with identical tokens that has
        not sampled yet, instead of prefilling again; a follower samples from its
        leader's first sample row (a prefill chunk's, or a decode row's where the last
        prompt token runs alone), so never from a leader that verifies drafts this step."""
        req.prompt_key = self._prompt_key(req)    # hashing a prompt once per admission try
        leader = self._leaders.get(req.prompt_key)
        if leader is None or leader.all_token_ids() != req.all_token_ids() \
                or any(c.request is leader for c in plan.verifies):
            return False    # (a verify row has no followers: batch_builder)
        self.waiting.remove(req)
        self._start(req, 0)
        req.dedup_leader = leader
        self.followers.setdefault(leader, []).append(req)
        plan.dedup_joins.append((req.request_id, leader.request_id))
        self.counters.dedup_joined += 1
        return True

    def _reserve_running(self, req: Request, n: int, plan: StepPlan) -> bool:
        """Reserve KV for a running request, preempting others if needed: those not yet
        scheduled this step, the newest (or the least important) first, never one that
        comes before `req` in that order (then `req` itself waits)."""
        reserve = self.kv.reserve_one if n == 1 else (lambda r, c: self.kv.reserve(r, n, c))
        if reserve(req, plan.copies):
            return True
        key = victim_key(self.knobs.scheduling_policy)    # the rare path from here
        while True:
            scheduled = {id(c.request) for c in plan.chunks}
            victims = [r for r in self.running if r is not req and id(r) not in scheduled
                       and r.dedup_leader is None]
            victim = max(victims, key=key, default=None)
            if victim is None or key(victim) < key(req):
                self.preempt(req, plan, swap=True)
                return False
            self.preempt(victim, plan, swap=True)
            if reserve(req, plan.copies):
                return True

    def preempt(self, req: Request, plan: StepPlan | None = None, swap: bool = False) -> None:
        """Free the request's blocks and requeue it at the front to recompute, or (swap,
        under preemption_mode=swap) to resume from its blocks' copy in the host tier; a
        swap the tier cannot take recomputes and says so (plan.swap_fallbacks)."""
        self.running.remove(req)
        self._drop_links(req)
        blocks = tuple(req.block_table)
        if swap and self.knobs.preemption_mode == "swap" and req.num_computed_tokens \
                and not self.kv.swap_out(req):
            self.counters.swap_fallbacks += 1
            if plan is not None:
                plan.swap_fallbacks.append(req.request_id)
        self.kv.free(req)
        req.status = RequestStatus.WAITING
        req.num_preemptions += 1
        req.chunks_done = 0
        self.counters.preemptions += 1
        self.waiting.appendleft(req)
        if plan is not None:
            plan.preempted.append((req, blocks))

    def _drop_links(self, req: Request) -> None:
        """Unlink dedup relations: a leaving leader sends its waiters back to the queue."""
        self._forget_leader(req)
        for follower in reversed(self.followers.pop(req, [])):
            follower.dedup_leader = None
            follower.status = RequestStatus.WAITING
            self.running.remove(follower)
            self.waiting.appendleft(follower)
        leader = req.dedup_leader
        if leader is not None:
            self.followers[leader].remove(req)
            req.dedup_leader = None

    def _forget_leader(self, req: Request) -> None:
        key = req.prompt_key      # as it was when the request was admitted
        if key is not None and self._leaders.get(key) is req:
            del self._leaders[key]

    def leader_sampled(self, leader: Request) -> list[Request]:
        """The leader computed its whole prompt: its waiters take its blocks now."""
        self._forget_leader(leader)
        waiters = self.followers.pop(leader, [])
        for f in waiters:
            f.dedup_leader = None
            self.kv.attach_shared(f, leader)
        return waiters

    def block_tables(self) -> list[list[int]]:
        return [r.block_table for r in self.running]
