"""Measure a guide's setup: the numbers its claim names, over a window of a live source's
snapshots (engine counters and latency samples, no UI), and whether they move as claimed.

`Window` accumulates what the TUI's panels show from its first snapshot on: TTFT
percentiles of the requests whose first token came in the window and of those still
waiting for one, at their wait so far (`NAMES`: "incl. waiting"), ITL percentiles of
its token gaps, TPOT p50 of the requests that finished in it, output tokens per second,
the prefix hit rate, preemptions, the mean running / waiting counts and KV use. It is
`ready` for a claim once each number the claim names has enough samples (a loaded
machine takes longer to get them: a window waits for data, not for a fixed time).
`verdicts` compares a window's numbers with the claim (`expect`) and the `versus`
setup's numbers. The app's guide scorecard (roseplay/tui/guides/run.py) and
tests/roseplay/tui/test_guides_verified.py run the same windows and the same checks.
"""
from __future__ import annotations

import math
import time
from array import array

import numpy as np

from engine.metrics import prefix_hit_rate
from roseplay.tui.widgets.counters import newer, step_time
from roseplay.workload.own_prompts import OWN_PREFIX

SAMPLE_EVERY = 0.1      # seconds between snapshots read while measuring
MAX_GAPS = 2_000_000     # token gaps a window keeps (its ITL percentiles are of the latest)
WARMUP_STEPS = 20       # engine steps a setup runs before it is measured: a new workload's
#                         first prompts prefill together (96 of them: ~12 steps), and a
#                         loaded machine runs fewer steps per second (a fixed time is not
#                         enough there)
WARMUP_SECONDS = 0.7    # at least, besides the steps
WARMUP_LIMIT = 20.0     # seconds: a setup that never runs that many steps is measured anyway
READY_LIMIT = 40.0      # seconds a measurement waits at most for the samples it needs
# the samples a number needs before it says anything: (what is counted, how many)
NEEDS = {"ttft_p50": ("first tokens", 8), "ttft_p90": ("first tokens", 8),
         "tpot_p50": ("finished requests", 3), "itl_p50": ("token gaps", 20),
         "itl_p99": ("token gaps", 20), "tok_s": ("output tokens", 32),
         "hit_rate": ("prefix lookups", 4), "chunks_p90": ("prefilled requests", 4),
         "mixed_steps": ("steps", 20), "running": ("samples", 10), "waiting": ("samples", 10),
         "kv_used": ("samples", 10), "spec_acceptance": ("verifies", 8),
         "spec_mean_accepted_len": ("verifies", 8), "preemptions": ("steps", 20),
         "evictions": ("steps", 20), "waiting_prompt_len": ("samples", 10),
         "queued": ("samples", 10)}
# a TTFT here counts a request still waiting for its first token with its wait so far:
# the Timing table's "TTFT" (first tokens only) is another figure, and its name says so
NAMES = {"ttft_p50": "TTFT p50 incl. waiting", "ttft_p90": "TTFT p90 incl. waiting",
         "tpot_p50": "TPOT p50",
         "itl_p50": "ITL p50", "itl_p99": "ITL p99", "tok_s": "output tok/s",
         "hit_rate": "prefix hit rate", "chunks_p90": "chunks per prompt p90",
         "mixed_steps": "mixed steps", "running": "running (mean)",
         "waiting": "waiting (mean)", "kv_used": "KV used (mean)",
         "spec_acceptance": "drafts accepted", "spec_mean_accepted_len": "accepted length",
         "preemptions": "preemptions", "evictions": "evictions",
         "queued": "requests waiting (mean)"}


def _pct(values, q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def _or(value: float, default: float) -> float:
    return default if math.isnan(value) else value


class Window:
    """The numbers of a setup from snapshot `first` on, fed one snapshot at a time."""

    def __init__(self, first):
        self.first = self.last = first
        self.running: list[int] = []
        self.waiting: list[int] = []
        self.used: list[float] = []
        self.waiting_len: list[int] = []
        self.queued: list[int] = []     # requests waiting, from the requests' states: the
        #                                 same on N replicas' merged snapshot as on one
        # TTFT of every request whose first token came in the window, running or finished
        # (finished ones alone would leave a slow setup with no sample at all)
        self.seen = {r.request_id for r in first.requests if r.ttft is not None}
        self.ttfts: dict[str, float] = {}
        self.chunks: dict[str, int] = {}    # prefill chunks of each request with a first token
        # every token gap and step of the window: a snapshot holds the latest 2048 gaps and
        # 256 steps (under 2 s and 4 s on the bundled CPU model), and the scorecard read
        # those as the window's
        self.gaps = array("d")              # the latest MAX_GAPS of them (16 MB)
        self.gap_t = self.step_t = first.time       # the latest read (engine time)
        self.steps_read = self.mixed = 0        # steps; those with decodes and prefill together

    def feed(self, snap) -> None:
        if snap.time < self.last.time:
            return                          # an older snapshot (a replay seek): skip it
        self.last = snap
        gaps = newer(snap.recent_itls, self.gap_t)
        steps = newer(snap.recent_steps, self.step_t, key=step_time)
        if gaps:
            self.gap_t = gaps[-1][0]
            self.gaps.extend(g for _, g in gaps)
            if len(self.gaps) > 1.1 * MAX_GAPS:
                del self.gaps[:len(self.gaps) - MAX_GAPS]
        if steps:
            self.step_t = steps[-1].wall_time
            self.steps_read += len(steps)
            self.mixed += sum(bool(s.decode_tokens and s.prefill_tokens) for s in steps)
        if snap.last_step is not None:
            self.running.append(snap.last_step.num_running)
            self.waiting.append(snap.last_step.num_waiting)
        self.used.append(snap.num_used / max(1, snap.num_blocks))
        self.waiting_len.extend(r.prompt_tokens for r in snap.requests if r.state == "waiting")
        self.queued.append(sum(r.state == "waiting" for r in snap.requests))
        new = [r for r in snap.requests if r.ttft is not None and r.request_id not in self.seen]
        self.chunks.update((r.request_id, r.chunks_done) for r in new)
        self.ttfts.update((r.request_id, r.ttft) for r in new
                          if r.state not in ("cancelled", "error"))

    # -- what the window holds ---------------------------------------------------------
    def counts(self) -> dict[str, float]:
        a, b = self.first.counters, self.last.counters
        return {"first tokens": len(self.ttfts), "finished requests": len(self._tpots()),
                "token gaps": len(self.gaps),
                "output tokens": b.generated_tokens - a.generated_tokens,
                "prefix lookups": b.prefix_lookups - a.prefix_lookups,
                "prefilled requests": len(self.chunks), "steps": b.steps - a.steps,
                "samples": len(self.used),
                "verifies": b.spec_decode_num_drafts - a.spec_decode_num_drafts}

    def missing(self, expect: dict) -> list[str]:
        """What the window still lacks to judge `expect` (empty: ready): samples of each
        named number, an output token, and for a number claimed > 0, one of it."""
        counts = self.counts()
        needs = {"output tokens": 1}
        for name in expect:
            if name == "hit_rate" and not self.last.knobs.enable_prefix_caching:
                continue                # the cache off: no lookup to wait for, rate 0
            what, n = NEEDS.get(name, ("samples", 10))
            needs[what] = max(n, needs.get(what, 0))
        out = [f"{n} {what} ({counts[what]:.0f} so far)"
               for what, n in needs.items() if counts[what] < n]
        result = self.result() if ">0" in expect.values() else {}
        out += [f"a count of {NAMES.get(name, name)} > 0 (0 so far)"
                for name, direction in expect.items()
                if direction == ">0" and not result.get(name)]
        return out

    def seconds(self) -> float:
        return self.last.time - self.first.time

    def _tpots(self) -> list[float]:
        # TPOT of the requests that finished in the window (the Timing panel's TPOT row): a
        # verify's tokens arrive together, so ITL's p50 is 0 there while TPOT is per token
        t0, t1 = self.first.time, self.last.time
        return [x[2] for x in self.last.recent_latencies if t0 < x[0] <= t1 and x[2] is not None]

    def result(self) -> dict:
        first, last = self.first, self.last
        t0, t1 = first.time, last.time
        a, b = first.counters, last.counters
        # a request still waiting for its first token at the end counts with its age so far
        # (a lower bound): without it a setup that delays long prompts past the window would
        # look fast, its slowest requests left out
        ttft = list(self.ttfts.values()) + [
            last.time - r.arrival_time for r in last.requests
            if r.ttft is None and r.state in ("waiting", "prefilling", "preempted")
            and r.arrival_time >= first.time and r.request_id not in self.ttfts]
        itl = np.frombuffer(self.gaps, dtype=np.float64) if self.gaps else []
        tpot = self._tpots()
        return dict(
            seconds=t1 - t0, finished=b.finished - a.finished,
            tok_s=(b.generated_tokens - a.generated_tokens) / max(t1 - t0, 1e-9),
            ttft_p50=_pct(ttft, 50), ttft_p90=_pct(ttft, 90),
            chunks_p90=_pct(list(self.chunks.values()), 90),
            # what the queue holds: a priority policy leaves the long low-priority documents
            waiting_prompt_len=float(np.mean(self.waiting_len)) if self.waiting_len else 0.0,
            itl_p50=_pct(itl, 50), itl_p99=_pct(itl, 99), tpot_p50=_pct(tpot, 50),
            hit_rate=prefix_hit_rate(b.prefix_hit_tokens - a.prefix_hit_tokens,
                                     b.prefix_queried_tokens - a.prefix_queried_tokens) or 0.0,
            preemptions=b.preemptions - a.preemptions, evictions=b.evictions - a.evictions,
            running=float(np.mean(self.running)) if self.running else 0.0,
            waiting=float(np.mean(self.waiting)) if self.waiting else 0.0,
            queued=float(np.mean(self.queued)) if self.queued else 0.0,
            kv_used=float(np.mean(self.used)) if self.used else 0.0,
            # steps that ran decodes and prefill chunks together (budget, mixed-chunk modes)
            mixed_steps=self.mixed / max(1, self.steps_read),
            # speculative decoding: acceptance 0 and a length of 1 (one token per decode)
            # when no request was verified with drafts
            spec_acceptance=_or(b.spec_acceptance(a)[0], 0.0),
            spec_mean_accepted_len=_or(b.spec_acceptance(a)[1], 1.0))


# -- the claim's verdict -------------------------------------------------------------------
# the directions that compare with the `versus` setup's number; "no later": at most
# NO_LATER times it (guide 1's TTFT against guide 2's: x0.34-1.04 in three runs of
# 2026-11-29, a loaded machine's noise on top)
COMPARED = ("lower", "higher", "no later")
NO_LATER = 1.5


def verdict(name: str, direction: str, mine: dict, theirs: dict | None) -> bool | None:
    """Whether `mine[name]` moves as `direction` says (">0", "=0", or COMPARED with
    `theirs`); None: no number to judge (no sample, or no versus measured)."""
    value = mine.get(name)
    if direction in (">0", "=0"):
        return None if value is None else (value > 0 if direction == ">0" else value == 0)
    other = theirs.get(name) if theirs else None
    if value is None or other is None:
        return None
    if direction == "no later":
        return value <= NO_LATER * other
    return value < other if direction == "lower" else value > other


def verdicts(expect: dict, mine: dict, theirs: dict | None) -> list[tuple[str, str, bool | None]]:
    """(name, direction, verdict) of each number the claim names."""
    return [(name, direction, verdict(name, direction, mine, theirs))
            for name, direction in expect.items()]


# -- headless: a source measured from the test ----------------------------------------------
class Settling:
    """What a setup's window waits for before it starts clean: the engine applying the
    setup's knobs, the old workload's requests ending, WARMUP_STEPS steps and `warmup` s
    after that, and for a claim about a full pool, an eviction. The app's guide run and
    the headless `measure` share it."""

    def __init__(self, snap, knobs: dict, old: set[str], full_pool: bool,
                 warmup: float = WARMUP_SECONDS):
        self.knobs, self.old, self.full_pool, self.warmup = knobs, old, full_pool, warmup
        self.started, self.evictions = snap.time, snap.counters.evictions
        self.wall = time.monotonic()
        self.applied: tuple[int, float] | None = None   # step and time the setup held from
        self.unclean = ""                                # why the window started anyway

    def settling(self, snap) -> str:
        """What the window still waits for ("" once clean)."""
        if self.applied is None:
            if any(getattr(snap.knobs, k) != v for k, v in self.knobs.items()):
                return "the engine applying the setup"
            self.applied = (snap.step, snap.time)
        old = sum(r.request_id in self.old for r in snap.requests
                  if r.state not in ("finished", "cancelled", "error"))
        steps = snap.step - self.applied[0]
        waits = []
        if old:
            waits.append(f"{old} old request{'s' if old > 1 else ''} to end")
        if steps < WARMUP_STEPS or snap.time - self.applied[1] < self.warmup:
            waits.append(f"warm-up step {min(steps, WARMUP_STEPS)}/{WARMUP_STEPS}")
        if self.full_pool and snap.counters.evictions <= self.evictions:
            waits.append("the pool to fill (evictions)")
        if waits and time.monotonic() - self.wall > WARMUP_LIMIT:
            self.unclean = f"started after {WARMUP_LIMIT:.0f} s without {', '.join(waits)}"
            return ""
        return ", ".join(waits)


def active_ids(snap) -> set[str]:
    """The requests a new setup waits to see end (typed prompts stay)."""
    return {r.request_id for r in snap.requests
            if r.state not in ("finished", "cancelled", "error")
            and not r.request_id.startswith(OWN_PREFIX)}


def measure(source, seconds: float, warmup: float = 1.0, expect: dict | None = None,
            limit: float = READY_LIMIT, knobs: dict | None = None,
            old: set[str] | None = None, full_pool: bool = False) -> dict:
    """Wait until the setup's window is clean (`Settling`: `knobs` applied, the `old`
    requests ended, WARMUP_STEPS steps and `warmup` s), then read at least `seconds` of
    it, and on until the window holds the samples `expect` needs (at most `limit` s)."""
    settling = Settling(source.snapshot(), knobs or {}, old or set(), full_pool, warmup)
    while settling.settling(source.snapshot()):
        time.sleep(SAMPLE_EVERY)
    window = Window(source.snapshot())
    start = time.monotonic()
    while True:
        time.sleep(SAMPLE_EVERY)
        window.feed(source.snapshot())
        elapsed = time.monotonic() - start
        if elapsed >= limit or (elapsed >= seconds and not window.missing(expect or {})):
            break
    window.feed(source.snapshot())
    return window.result()


def wait_for_evictions(source, timeout: float) -> bool:
    """Wait until the pool evicts (a claim about eviction needs a full pool); False if it
    did not within `timeout` s."""
    start = source.snapshot().counters.evictions
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if source.snapshot().counters.evictions > start:
            return True
        time.sleep(SAMPLE_EVERY)
    return False


def run_setup(source, guide, seconds: float, warmup: float = 1.0) -> dict:
    """Apply `guide` (its whole setup) to a live source and measure it, clean."""
    from roseplay.tui.guides.catalog import apply_guide, clean_knobs
    old = active_ids(source.snapshot())
    apply_guide(source, guide)
    return measure(source, seconds, warmup, guide.expect,
                   knobs=clean_knobs(guide, getattr(source, "knob", None)), old=old)
