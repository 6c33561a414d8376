"""How the engine core contains a failed step (docs/RELIABILITY.md): a step's fault
fails the requests that caused it, never the engine, and never another request.

`StepFaults` is a part of LLMEngine (engine/core/core.py), kept apart because the step
itself does not need to be read to follow it: `_isolate` reruns a failed launch request
by request, `_fail_plan` ends a plan's requests with the error.
"""
from __future__ import annotations

from engine.codes import REASON_ERROR
from engine.core.step_plan import StepPlan
from engine.outputs import StepOutput


class StepFaults:
    def _isolate(self, plan: StepPlan, exc: Exception, out: StepOutput) -> None:
        """A step of several requests failed: run each request's part of it alone, so
        that a fault one request's input causes fails that request only (and a fault
        that does not come back fails nobody). Nothing of the failed step was committed:
        each part recomputes its KV from the same positions. Costs one forward per
        request, on failure only. Only for a failed launch (forward or sampler): once
        the commit has begun, a rerun would count the same chunk twice."""
        if len(plan.chunks) < 2 or plan.kv_error is not None:   # (its reloads hold nothing)
            self._fail_plan(plan, exc, out)
            return
        self.stats.last_error = f"{type(exc).__name__}: {exc}"     # reported either way
        for chunk in plan.chunks:
            if chunk.request.request_id not in self.requests:
                continue            # failed (or finished) as a dedup follower meanwhile
            rid = chunk.request.request_id
            part = StepPlan(decodes=[chunk] if chunk in plan.decodes else [],
                            prefills=[chunk] if chunk in plan.prefills else [],
                            verifies=[chunk] if chunk in plan.verifies else [],
                            copies=[c for c in plan.copies if c[2] == rid])
            try:
                launched = self._launch(part)
                self._commit(part)
                self._emit_tokens(launched, out)
            except Exception as part_exc:
                self._fail_plan(part, part_exc, out)

    def _fail_plan(self, plan: StepPlan, exc: Exception, out: StepOutput) -> None:
        """Fail the plan's own requests. Their dedup followers computed nothing of their
        own: finishing the leader sends them back to the queue (Scheduler._drop_links),
        where one of them leads a fresh prefill; a failed request never fails another."""
        msg = f"{type(exc).__name__}: {exc}"
        for c in plan.chunks:
            req = c.request
            if req.request_id in self.requests:
                self._finish(req, REASON_ERROR, msg, out)
        for req in list(self.scheduler.running):   # followers that took a leader's blocks
            if req.dedup_leader is None and req.num_uncomputed < 1:   # but not its token:
                self.scheduler.preempt(req)       # never schedulable as is: recompute it
                self._redraw_first(req)
        self.stats.last_error = msg
