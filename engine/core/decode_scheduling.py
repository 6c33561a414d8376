"""The scheduler's decodes (a part of Scheduler, engine/core/scheduler.py): which running
requests decode next and which still prefill, and one token for each decode.

The partition is one pass over the running requests (engine/core/running_pass.py), or,
after a steady decode step, array arithmetic on the last plan's kept columns
(engine/core/steady_decodes.py). Decodes whose slot lies in a block they own alone
need no KV work and become chunks in one go; the others (a block boundary, a shared
block to copy) reserve their slots in order, and a reservation that finds the pool dry
preempts requests not yet scheduled.
"""
from __future__ import annotations

from engine.core.running_pass import classify, fast_chunks, split
from engine.core.sched_policy import running_order
from engine.core.steady_decodes import MIN_DECODES, DecodeColumns
from engine.core.step_plan import ScheduledChunk, StepPlan
from engine.request import Request, RequestStatus


class DecodeScheduling:
    def _partition(self, order: list[Request], steady: DecodeColumns | None,
                   gone: list[int], joined: list
                   ) -> tuple[list[Request], list[bool] | None, list[Request], object]:
        """Running requests that decode next (and whether each needs no KV work: None,
        every one), and those still prefilling, in the policy's order. Left out: dedup
        followers, and a request its pending token ends by length. After a steady step
        (engine/core/steady_decodes.py) by array arithmetic on the last plan's columns
        less the rows `gone` (requests ended since its launch) and with the requests
        whose prompts it finished (`joined`), with the decodes' columns (the fourth
        item); else in one pass over the running requests (engine/core/running_pass.py)."""
        if steady is not None and not self.followers and order == steady.live(gone, joined):
            decodes, fast, columns = steady.advance(self.pool.block_size, self.kv.tables,
                                                    self.pool.refcounts, gone, joined)
            return decodes, fast, [], columns
        codes = classify(order, self.pool.block_size, self.pool.refs, bool(self.followers))
        return *split(order, codes), None

    def _keep_columns(self, plan: StepPlan, order: list[Request],
                      columns: DecodeColumns | None) -> None:
        """Keep the columns of a plan that decodes every running request in order (less
        those the last step's tokens end by length): for the batch builder
        (StepPlan.decode_columns, where they came from the last plan's) and the next
        step's partition. Its prefill chunks, if any, are of requests admitted now: the
        commit tells whether they all finished their prompts (decodes_pending), and only
        then do the columns step on, with those requests added."""
        if plan.verifies or plan.preempted:
            return
        if columns is not None:
            if len(plan.decodes) == len(columns.requests):
                plan.decode_columns = columns
                self._steady, self._steady_plan = columns, plan
        elif len(plan.decodes) >= MIN_DECODES:
            self._steady, self._steady_plan = DecodeColumns.of(plan, order), plan

    def decodes_pending(self, plan: StepPlan, gone: list[int], joined: list) -> None:
        """The plan is committed and every one of its decodes still running samples a
        pending token, as does every prompt it finished (commit_plan under async
        scheduling); `gone`: the rows of requests that ended since its launch, `joined`:
        the (row, request) of those prompts. Its kept columns step on from it, less the
        rows gone, with the prompts' requests added."""
        self._pending_plan, self._pending_gone, self._pending_joined = plan, gone, joined

    def steady_rows(self, plan: StepPlan) -> bool:
        """The rows of `plan`'s kept columns (its first sample rows) still resolve a
        pending token each, and came with the last step's tokens
        (engine/core/steady_decodes.py append_steady): it stepped on from the last
        plan's columns, was committed with every token pending, and its requests lead
        the running ones still (those admitted since come after them)."""
        cols = plan.decode_columns.requests
        return plan is self._pending_plan and running_order(
            self.running, self.knobs.scheduling_policy)[:len(cols)] == cols

    def check_columns(self) -> None:
        """The kept decode columns match their requests (check_invariants)."""
        steady = self._steady
        if steady is not None and steady.requests == running_order(
                self.running, self.knobs.scheduling_policy):
            steady.check()

    def _schedule_decodes(self, plan: StepPlan, decodes: list[Request],
                          fast: list[bool] | None, budget: int | None) -> int | None:
        """One token for each running decode; budget None: all of them. `fast`: which
        decodes need no KV work (None: all of them); each other one reserves its slot,
        in order. When every decode fits the budget, those reservations run first and
        every chunk is made in one go, as long as the pool has room; from a reservation
        that finds it dry (it preempts requests not yet scheduled, or its own request
        waits) on, runs of decodes become chunks between the reservations."""
        if budget is not None and len(decodes) > budget:   # rotate: every decode gets a turn
            k = self._decode_offset % len(decodes)
            decodes = decodes[k:] + decodes[:k]
            fast = None if fast is None else fast[k:] + fast[:k]
            self._decode_offset += budget
        base = len(plan.decodes)
        left = len(decodes) if budget is None else min(budget, len(decodes))
        if fast is None and left == len(decodes):     # no KV work at all
            plan.decodes.extend(fast_chunks(decodes))
            return None if budget is None else budget - len(decodes)
        slow = [] if fast is None else [i for i, f in enumerate(fast) if not f]
        start = self._reserve_ahead(plan, decodes, slow) if left == len(decodes) else 0
        if start < len(decodes):
            self._schedule_runs(plan, decodes, [i for i in slow if i >= start], start,
                                left - start)
        return None if budget is None else budget - (len(plan.decodes) - base)

    def _reserve_ahead(self, plan: StepPlan, decodes: list[Request], slow: list[int]) -> int:
        """Reserve the slots of the `slow` decodes in order while the pool has room
        without preempting, and schedule every decode before the first that finds none:
        returns its index (len(decodes): none did)."""
        reserve, copies, end = self.kv.reserve_one, plan.copies, len(decodes)
        for i in slow:
            if not reserve(decodes[i], copies):
                end = i
                break
        plan.decodes.extend(fast_chunks(decodes[:end] if end < len(decodes) else decodes))
        return end

    def _schedule_runs(self, plan: StepPlan, decodes: list[Request], slow: list[int],
                       start: int, left: int) -> None:
        """Schedule up to `left` of decodes[start:]: runs of them that need no KV work
        at once, each `slow` one after reserving its slot (which may preempt requests
        not yet scheduled: those later in the order are then skipped)."""
        running, scheduled, preempted = RequestStatus.RUNNING, plan.decodes, len(plan.preempted)
        for end in slow + [len(decodes)]:
            run = decodes[start:end]
            if len(plan.preempted) != preempted:   # preempted by a reservation before
                run = [r for r in run if r.status is running]
            run = run[:left]
            scheduled.extend(fast_chunks(run))
            left -= len(run)
            if not left or end == len(decodes):
                break
            req = decodes[end]
            if req.status is running and self._reserve_running(req, 1, plan):
                scheduled.append(ScheduledChunk(req, req.num_computed_tokens, 1, True))
                left -= 1
            start = end + 1
