"""Async scheduling (the `async_scheduling` knob, vLLM V1's), a part of LLMEngine
(engine/core/core.py): every step is launched and left in flight; the next call commits
its KV bookkeeping, counts each of its samples as a pending token
(request.add_pending_tokens), asks the scheduler for the next step as usual, launches it
with the pending tokens fed from the in-flight step's samples (on the device), and only
then reads the tokens. So the host's planning of step N+1 overlaps the device's step N,
prefill chunks and mixed steps included. A request that its token ends (EOS, stop)
computes one more token in N+1, which is discarded. A step that cannot chain (a
speculative verify: its accepted counts set the next positions) is left in flight too:
the next call reads its tokens first, then plans and launches N+1 (`_launch_settled`),
and records N and returns its outputs while N+1 runs. Under tensor parallelism too: every
rank samples and keeps its samples on its device (engine/worker/executor/tp.py), so a
continuation needs nothing from rank 0's host but the batch it broadcasts anyway.
"""
from __future__ import annotations

from engine.core.launched import Launched
from engine.core.step_plan import StepPlan
from engine.core.spec_decode import SPEC_ASYNC_RUN
from engine.outputs import StepOutput
from engine.request import RequestStatus, add_pending_tokens


class AsyncSteps:
    def _may_chain(self, prev: StepPlan) -> bool:
        """Launch the next step before reading `prev`'s tokens (async scheduling)? Always
        without speculation. With it (docs/SPECULATIVE.md "Async scheduling"): never after
        a verify (its accepted count sets the next positions), and at most
        SPEC_ASYNC_RUN steps in a row, since a chained step plans its decodes with their
        tokens pending and the proposer needs them on the host: then a step is planned
        with every token known, and proposes again. Nor after a step with a decode that
        waited for its token and that the proposer has not declined lately (a request's
        first decodes: a drafter that always proposes, a draft model, would miss them).
        A step that the off-switch (disable_by_batch_size) left without drafts chains as
        without speculation; the first step under the threshold plans with its tokens
        pending, waits for them (spec_waiting) and the one after it proposes again."""
        if prev.verifies:     # whatever k is now: a live k of 0 leaves verifies in flight
            return False
        if not self.speculating or prev.spec_off:   # a plain decode step (disable_by_batch_size)
            return True
        if prev.spec_waiting or self._chained >= SPEC_ASYNC_RUN:
            return False
        self._chained += 1
        return True

    def _sample_deferred(self, launched: Launched) -> None:
        """Structured outputs under async scheduling: the step's forward ran while the
        previous step's tokens were read and its matchers advanced; now its mask is
        filled and its sampling queued (vLLM V1's deferred grammar bitmask)."""
        ex = self.executor
        try:
            launched.host_tokens = ex.sample_deferred(self.structured.fill(launched.grammar))
            launched.logprobs = ex.take_logprobs(launched.batch)
        except Exception:
            ex.rewind_draws()     # rerun request by request: draws as never made
            raise
        for req in launched.requests:     # ended meanwhile: drop the sampler state its
            if req.request_id not in self.requests:   # row just made again
                ex.release(req.request_id)

    def _complete_inflight(self, chain: bool) -> StepOutput:
        """Commit the step in flight, plan and launch the next one (chain), then read the
        in-flight step's tokens: the host plans step N+1 while the device runs step N.
        A step that may not chain: its tokens are read first, then the next step is
        planned and launched (chain asked, async scheduling on), then the step in flight
        is recorded and its outputs returned, while the next one runs."""
        prev, self._inflight = self._inflight, None
        out = StepOutput()
        failed = None
        follow = chain and self.async_scheduling    # a next step is launched in this call
        settled = False
        try:
            chain = follow and self._may_chain(prev.plan) \
                and (self.executor.defers_sampling or prev.grammar is None)
            # chaining: each request prev samples counts its token as pending (the
            # scheduler plans with it, the runner feeds it from the device), in the
            # commit's own pass where it can
            if not self._commit(prev.plan, prev.requests if chain else None) and chain:
                add_pending_tokens(prev.requests)
            if chain:
                failed = self._launch_next(prev)
            self._emit_tokens(prev, out)
            settled = True
        except Exception as exc:     # every plan that depends on prev's samples fails
            plans = [prev.plan] + [p for p in (getattr(self._inflight, "plan", None),
                                               failed and failed[0]) if p is not None]
            self._inflight = failed = None
            for plan in plans:
                self._fail_plan(plan, exc, out)
            for req in prev.requests:       # followers: their tokens are never read, so
                if req.num_pending and req.request_id in self.requests:   # recompute them
                    req.drop_pending()
                    self._redraw_first(req)
                    if req.status is RequestStatus.RUNNING:
                        self.scheduler.preempt(req)
        if settled and follow and not chain:    # (a verify): the next step, planned with
            failed = self._launch_settled()     # every token known, runs on the device
            #                                     while prev's bookkeeping and outputs are done
        nxt = self._inflight
        if nxt is not None and nxt.host_tokens is None:
            try:
                self._sample_deferred(nxt)
            except Exception as exc:    # rerun request by request (below)
                self._inflight, failed = None, (nxt.plan, exc)
        self._after_step(prev.plan, prev.t0, out)
        if failed is not None:   # rerun request by request, now that prev's tokens are known
            plan, exc = failed
            self._isolate(plan, exc, out)
            self._record(plan, self.clock.now(), 0)
        return out

    def _launch_settled(self) -> tuple[StepPlan, Exception] | None:
        """Plan and launch the next step once the previous one's tokens are in (after a
        step that could not chain: a verify, whose accepted counts set the next
        positions): the same plan a later call would make, launched before the previous
        step's stats, events and outputs (and the caller's processing of them), so that
        those overlap its device work. Returns (plan, error) if the launch failed."""
        self._chained = 0
        return self._plan_and_launch(device_fed=False)

    def _launch_next(self, prev: Launched) -> tuple[StepPlan, Exception] | None:
        """Plan and launch the step after `prev` before prev's tokens are read (its
        samples already count as pending tokens, fed from the device). Returns (plan,
        error) if the launch failed."""
        return self._plan_and_launch(device_fed=True)

    def _plan_and_launch(self, device_fed: bool) -> tuple[StepPlan, Exception] | None:
        """The next step's plan, launched as the step in flight; (plan, error) if the
        launch failed, None otherwise (also when there is nothing to plan)."""
        plan = self._schedule()
        if not plan:
            return None
        try:
            self._inflight = self._launch(plan, device_fed=device_fed)
        except Exception as exc:
            return plan, exc
        return None
