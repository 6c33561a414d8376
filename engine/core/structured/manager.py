"""The core's structured outputs: each constrained request's grammar state, and the one
packed bitmask per step (docs/STRUCTURED_OUTPUTS.md).

The engine core calls, in step order:
  add(req)            at admission: the compiled grammar from the cache (ready: the
                      request goes to the scheduler), else its compile starts and the
                      request waits in `compiling` (a visible state), not in the queue
  poll()              every step: compiles that finished (ready, or failed: the request
                      ends with GRAMMAR_ERROR), and those past compile_timeout
  validate_drafts()   speculative decoding: a draft is cut to the longest prefix the
                      grammar accepts (checked without advancing the matcher)
  step_mask()         at launch: the step's constrained sample rows, and their bitmask
                      when every such request's tokens are known; else the mask is
                      filled later (fill), after the previous step's tokens are read,
                      while the device runs this step's forward
  advance()           after a step's tokens are read: each matcher consumes its
                      request's new tokens (a verify's accepted ones only: rejected
                      drafts were never consumed); a complete grammar allows only EOS,
                      which ends the request (as a stop token, or here under ignore_eos)
"""
from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, wait

import numpy as np

from engine.codes import REASON_ERROR, REASON_STOP
from engine.config import StructuredOutputsConfig
from engine.core.structured.compiler import GrammarCompiler, LazyBackend
from engine.worker.host_masks import MaskRing
from engine.core.structured.view import StepViews
from engine.request import RequestStatus
from engine.grammars import reason
from engine.structured_outputs import GRAMMAR_ERROR
from engine.worker.step_batch import GrammarMask


class RequestGrammar:
    """One constrained request's grammar: compiling (future) or ready (matcher)."""
    __slots__ = ("params", "future", "since", "matcher", "consumed", "view")

    def __init__(self, params, since: float):
        self.params, self.since = params, since
        self.future: Future | None = None
        self.matcher = None
        self.consumed = 0           # output tokens the matcher has consumed
        self.view = None            # the TUI's last step (engine/snapshot.py GrammarView)

    @property
    def ready(self) -> bool:
        return self.matcher is not None


class StepMask:
    """A launched step's constrained rows: (request, first sample row, drafts) each, and
    the mask once filled (GrammarMask)."""
    __slots__ = ("entries", "rows", "mask", "views")

    def __init__(self, entries: list, rows: np.ndarray):
        self.entries, self.rows = entries, rows
        self.mask: GrammarMask | None = None
        self.views = None

    @property
    def requests(self):
        return [e[0] for e in self.entries]


class StructuredOutputManager:
    def __init__(self, config: StructuredOutputsConfig, build_backend, pinned: bool,
                 counters):
        self.config = config
        self.counters = counters    # grammar_compiles / _steps / _rows / _fill_us
        self.backend = LazyBackend(build_backend)
        self.compiler = GrammarCompiler(self.backend, config.grammar_cache_size, counters)
        self.compiling: dict[str, object] = {}     # request id -> Request, compile pending
        self.masks = MaskRing(pinned)
        self.views = StepViews()
        self.active = 0             # requests with a grammar, not ended

    # -- compiling -------------------------------------------------------------------
    def add(self, req) -> bool:
        """Start the request's grammar; True if it is ready now (a cache hit)."""
        g = req.grammar = RequestGrammar(req.params.structured_outputs, time.monotonic())
        self.active += 1
        got = self.compiler.request(g.params)
        if isinstance(got, Future):
            g.future = got
            self.compiling[req.request_id] = req
            return False
        g.matcher = self.backend.ready.matcher(got)
        return True

    def poll(self, ready) -> list:
        """Finished compiles: ready(request) for each request whose grammar is ready;
        returns (request, error) of those whose compile failed or timed out."""
        failed, now = [], time.monotonic()
        timeout = self.config.compile_timeout
        for rid, req in list(self.compiling.items()):
            g = req.grammar
            if g.future.done():
                del self.compiling[rid]
                try:
                    compiled = self.compiler.take(g.params, g.future)
                    g.matcher = self.backend.ready.matcher(compiled)
                    ready(req)
                except Exception as exc:
                    failed.append((req, f"{GRAMMAR_ERROR}: {reason(exc)}"))
                g.future = None
            elif now - g.since > timeout:
                del self.compiling[rid]
                self.compiler.forget(g.params, g.future)
                failed.append((req, f"{GRAMMAR_ERROR}: not compiled within "
                                    f"compile_timeout ({timeout:g} s)"))
        return failed

    def wait(self, timeout: float) -> None:
        """Block until some compile finishes (at most `timeout`): the engine has nothing
        else to do."""
        futures = {r.grammar.future for r in self.compiling.values()}
        if futures:
            wait(futures, timeout, return_when=FIRST_COMPLETED)

    def release(self, req) -> bool:
        """The request ended; True if its grammar never became ready (it never entered
        the scheduler: compiling, failed, or timed out)."""
        self.active -= 1
        self.compiling.pop(req.request_id, None)
        return not req.grammar.ready

    # -- the step's mask -------------------------------------------------------------
    def step_mask(self, requests: list, plan, draft_rows) -> StepMask | None:
        """The constrained sample rows of a step (row i samples requests[i]), filled now
        when every constrained request's tokens are known."""
        verify = {} if draft_rows is None else {c.request: c for c in plan.verifies}
        lo = -1 if draft_rows is None else int(draft_rows[0])
        entries, rows, seen = [], [], set()
        for i, r in enumerate(requests):
            if r.grammar is None:
                continue
            chunk = verify.get(r) if i >= lo >= 0 else None
            if chunk is None:
                entries.append((r, i, []))
                rows.append(i)
            elif id(r) not in seen:         # a verify: one entry, its rows in order
                seen.add(id(r))
                entries.append((r, i, list(chunk.draft)))
                rows.extend(range(i, i + chunk.num_tokens))
        if not entries:
            return None
        step = StepMask(entries, np.asarray(rows, np.int64))
        if all(r.pending_row < 0 for r, _, _ in entries):
            self.fill(step)
        else:
            step.mask = GrammarMask(step.rows)
        return step

    def fill(self, step: StepMask) -> GrammarMask:
        """The step's bitmask, from each matcher's state now (in the rows' order)."""
        t0 = time.perf_counter()
        backend = self.backend.ready
        bitmask = self.masks.take(len(step.rows), backend.words)
        live, k = [], 0
        for r, _, drafts in step.entries:
            if r.status is RequestStatus.RUNNING and r.grammar.matcher is not None:
                live.append((r.grammar.matcher, k, drafts))
            else:                    # ended meanwhile: its token is dropped; allow all
                bitmask[k:k + 1 + len(drafts)] = -1
            k += 1 + len(drafts)
        if live:
            backend.fill(live, bitmask)
        self._hold_stop_tokens(step, bitmask)
        step.views = self.views.before(step, bitmask, backend)
        step.mask = GrammarMask(step.rows, bitmask)
        c = self.counters
        c.grammar_steps += 1
        c.grammar_rows += k
        c.grammar_fill_us += int((time.perf_counter() - t0) * 1e6)
        return step.mask

    @staticmethod
    def _hold_stop_tokens(step: StepMask, bitmask: np.ndarray) -> None:
        """min_tokens: a row's stop tokens stay masked while its output is short, unless
        the grammar allows nothing else (then the grammar wins: the output is complete)."""
        k = 0
        for r, _, drafts in step.entries:
            if r.params.min_tokens > len(r.output_token_ids) and r.stop_ids:
                row = bitmask[k].view(np.uint32).copy()
                for t in r.stop_ids:
                    if t < row.shape[0] * 32:
                        row[t >> 5] &= np.uint32(~(1 << (t & 31)) & 0xFFFFFFFF)
                if row.any():
                    bitmask[k] = row.view(np.int32)
            k += 1 + len(drafts)

    # -- after a step's tokens are read -----------------------------------------------
    def advance(self, step: StepMask, row_logprobs) -> list[tuple]:
        """Each constrained request's matcher consumes its new output tokens. Returns
        (request, reason, error) for those it ends: its grammar took EOS (a stop; the
        step ended it already unless it ignores EOS), or refused a token (an error)."""
        ended, eos = [], self.backend.ready.eos_ids
        for r, row, _ in step.entries:
            g = r.grammar
            if r.status.done or g.matcher is None:   # (a request preempted since its
                continue                             # launch keeps the token it sampled)
            out = r.output_token_ids
            n = len(out) - r.num_pending
            if n > g.consumed:
                new = out[g.consumed:n]
                if not g.matcher.consume(new):
                    ended.append((r, REASON_ERROR, f"{GRAMMAR_ERROR}: "
                                  f"{g.matcher.error() or 'token not allowed'}"))
                    continue
                g.consumed = n
            if n and out[n - 1] in eos and g.matcher.is_stopped():
                ended.append((r, REASON_STOP, None))     # (ignore_eos: EOS ends it here)
        if step.views:
            self.views.after(step, row_logprobs)
        return ended

    def validate_drafts(self, req, draft: list[int]) -> list[int]:
        """The longest prefix of `draft` the request's grammar accepts (no state change)."""
        if not draft or req.grammar is None or req.grammar.matcher is None:
            return draft
        return draft[:req.grammar.matcher.validate(draft)]

    def close(self) -> None:
        self.compiler.close()
