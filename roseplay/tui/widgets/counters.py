"""Engine counters over the last WINDOW seconds and since the last reset (key 0).

The engine's counters are totals since it started; a learner needs "what happens now"
(a hit rate that drops within seconds of turning the cache off) next to the totals, and
a way to start counting afresh after changing a knob. Times are engine time (snapshot
`time`); time going backwards (a replay seek) starts afresh.
"""
from __future__ import annotations

from collections import deque

from engine.metrics import prefix_hit_rate
from roseplay.tui.widgets.latency import view_latencies

WINDOW = 10.0       # seconds behind the "last 10 s" figures (and the timing percentiles)


class CounterWindow:
    def __init__(self, window: float = WINDOW):
        self.window = window
        self._samples: deque = deque()       # (time, EngineCounters), oldest first
        self.base = None                     # counters at the last reset (None: engine start)
        self.reset_time: float | None = None
        self.restart_time: float | None = None   # the window's start after a knob change
        self.now = None
        self.peak: int | None = None         # KV blocks in use at most since the last reset
        self._ended: dict = {}               # request id -> (its end, its finished view)
        self._itls: deque = deque()          # (time, gap) of every token gap seen, WINDOW s
        self._steps: deque = deque()         # StepStats of every step seen, WINDOW s

    def feed(self, snap) -> None:
        t, c = snap.time, snap.counters
        if self._samples and (t < self._samples[-1][0] or c.steps < self._samples[-1][1].steps):
            self._samples.clear()
            self.base = self.reset_time = self.restart_time = self.peak = None
            self._ended = {}
            self._itls.clear()
            self._steps.clear()
        if not self._samples or self._samples[-1][1] is not c:
            self._samples.append((t, c))
        while len(self._samples) > 1 and self._samples[1][0] <= t - self.window:
            self._samples.popleft()
        self.now = c
        if self.base is not None:
            self.peak = max(self.peak or 0, snap.num_used)
        self._keep_ended(snap)
        self._itls.extend(newer(snap.recent_itls, self._itls[-1][0] if self._itls else None))
        self._steps.extend(newer(snap.recent_steps, self._steps[-1].wall_time if self._steps
                                 else None, key=step_time))
        while self._itls and self._itls[0][0] < t - self.window:
            self._itls.popleft()
        while self._steps and self._steps[0].wall_time < t - self.window:
            self._steps.popleft()

    def _keep_ended(self, snap) -> None:
        """A snapshot holds the latest RECENT_FINISHED (64) ended requests: under load
        more finish in WINDOW s (120), and the goodput share read "of 64". Each finished
        view the app sees is kept until it ended WINDOW s ago."""
        for r in snap.requests:
            if r.state == "finished" and r.ttft is not None:
                self._ended[r.request_id] = (r.arrival_time + view_latencies(r)[2], r)
        old = snap.time - self.window
        for rid in [rid for rid, (end, _) in self._ended.items() if end < old]:
            del self._ended[rid]

    def requests(self, snap) -> list:
        """The snapshot's requests and the finished ones of the window it let go of."""
        ids = {r.request_id for r in snap.requests}
        return [*snap.requests, *(r for rid, (_, r) in self._ended.items() if rid not in ids)]

    def itls(self) -> deque:
        """(time, gap) of the token gaps of the last WINDOW s: a snapshot holds the latest
        RECENT_SAMPLES (2048), which 16 requests decoding on the bundled CPU model fill in
        under 2 s (the "10 s" ITL percentiles read those); the gaps the app sees are kept."""
        return self._itls

    def steps(self) -> deque:
        """The steps of the last WINDOW s, kept likewise (a snapshot holds 256: under 4 s
        of the default workload, 0.3 s of guide d's one request)."""
        return self._steps

    def reset(self) -> None:
        """Totals count from now on; the window starts empty."""
        if self.now is not None:
            self.base = self.now
            self.reset_time = self._samples[-1][0]
            self.peak = None
            self.restart()

    def restart(self) -> None:
        """The window starts empty (a knob changed: its last 10 s would mix the setups
        before and after for 10 s); the totals go on."""
        if self._samples:
            self.restart_time = self._samples[-1][0]
            self._samples = deque([self._samples[-1]])

    @property
    def since(self) -> float | None:
        """Engine time the window's figures start at, when later than WINDOW s ago."""
        times = [t for t in (self.reset_time, self.restart_time) if t is not None]
        return max(times) if times else None

    def peak_used(self, snap) -> int:
        """KV blocks in use at most: since the last reset, else the engine's peak."""
        return snap.peak_used_blocks if self.base is None else max(self.peak or 0,
                                                                    snap.num_used)

    def recent(self, name: str) -> int:
        return getattr(self.now, name) - getattr(self._samples[0][1], name)

    def span(self) -> float:
        """Seconds of engine time the window's `recent` figures cover."""
        return self._samples[-1][0] - self._samples[0][0] if self._samples else 0.0

    def rate(self, name: str) -> float | None:
        """`name` a second over the window (the Timing line's tok/s and the compare
        table's: one figure); None while the window spans no time (just restarted)."""
        span = self.span()
        return self.recent(name) / span if span > 0 else None

    def total(self, name: str) -> int:
        return getattr(self.now, name) - (getattr(self.base, name) if self.base else 0)

    def hit_rate(self, recent: bool) -> float | None:
        """Prefix-cache hit rate (hit tokens / looked-up tokens); None with no lookups."""
        get = self.recent if recent else self.total
        return prefix_hit_rate(get("prefix_hit_tokens"), get("prefix_queried_tokens"))


def step_time(step) -> float:
    """A step's key for `newer`: its time, not its number (replicas' merged snapshots
    order their steps by time, each replica numbering its own)."""
    return step.wall_time


def newer(samples, after, key=lambda x: x[0]) -> list:
    """The items of `samples` (a snapshot's bounded recent list, oldest first) later than
    `after` by `key` (all of them for None): what came since the last snapshot read."""
    fresh = []
    for x in reversed(samples):
        if after is not None and key(x) <= after:
            break
        fresh.append(x)
    return fresh[::-1]
