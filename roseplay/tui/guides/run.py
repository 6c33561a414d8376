"""A guide running in the app: its window, and its scorecard (expected vs measured).

A digit on the help screen switches the engine to a guide's setup (guides.py
`apply_guide`) and starts a `GuideRun`. The run waits until its window is *clean* (the
engine applied the setup, the old workload's requests are gone, WARMUP_STEPS steps ran,
and for a claim about a full pool, the pool evicts), tells the app to reset the stats
then, and measures the setup with roseplay/tui/guides/check.py's `Window`, the window the
tests measure with. The scorecard shows each number the claim names, what the claim
expects, what the window measured, and the verdict (guide_check `verdicts`, the tests'
check) as soon as the window holds enough samples.

A claim that compares ("TTFT lower than guide 6's") needs the other setup measured too:
its partner guide's last result this session, or, where one key or typed value turns
the guide's setup into the other (`c` for guides 5 and 6, `P` back to fcfs for 9, `e`
back to lru for 0), that turn: the app then starts the other setup clean, as the tests
measure it (on a full pool, guide 0, it only turns the knob, as the test does), and the
run measures it as the `versus` side. Any other change ends the run (its results stay
for the partner's scorecard).
"""
from __future__ import annotations

from roseplay.tui.guides.check import COMPARED, NO_LATER, Settling, Window, active_ids, verdicts


class Side(Settling):
    """One setup measured: settling until its window is clean, then a Window."""

    def __init__(self, key: str, snap, knobs: dict, old: set[str], full_pool: bool):
        super().__init__(snap, knobs, old, full_pool)
        self.key = key
        self.window: Window | None = None

    def feed(self, snap) -> bool:
        """True when the window just became clean (the app resets the stats)."""
        if self.window is not None:
            self.window.feed(snap)
            return False
        if self.settling(snap):
            return False
        self.window = Window(snap)
        return True


class GuideRun:
    """A guide's setup (and its versus, where a knob turn measures it) in the app."""

    def __init__(self, guide, snap, knobs: dict, results: dict):
        self.guide = guide
        self.results = results            # setup key -> its last measured numbers (session)
        self.side = Side(guide.key, snap, knobs, active_ids(snap), guide.full_pool)
        self.last = snap

    @property
    def measuring_versus(self) -> bool:
        return self.side.key != self.guide.key

    def feed(self, snap) -> bool:
        """Feed a snapshot; True when the window just became clean."""
        self.last = snap
        clean = self.side.feed(snap)
        window = self.side.window
        if window is not None and not window.missing(self.expect_of(self.side.key)):
            self.results[self.side.key] = window.result()
        return clean

    def expect_of(self, key: str) -> dict:
        """What a side's window must hold: the claim's numbers (a versus: those it is
        compared on)."""
        if key == self.guide.key:
            return self.guide.expect
        return {n: d for n, d in self.guide.expect.items() if d in COMPARED}

    def turned(self, setup: dict):
        """A knob or the workload changed, to `setup` (guides.setup_of's keys): the versus
        Guide if that is its setup (the caller starts it clean, as the tests measure it,
        except on a full pool, which a clean start would empty; then `measure_versus`),
        None: the run ends."""
        from roseplay.tui.guides.catalog import find, setup_of
        versus = find(self.guide.versus)
        if versus is not None and not versus.routing:    # (a data-parallel engine's
            setup = {k: v for k, v in setup.items() if k != "routing"}   # policy: no matter)
        if versus is None or self.measuring_versus or setup != setup_of(versus):
            return None
        return versus

    def measure_versus(self, versus, snap, knobs: dict) -> None:
        """Measure the versus setup from `snap` on, once its window is clean (the requests
        active now end first, unless the pool must stay full)."""
        old = set() if self.guide.full_pool else active_ids(snap)
        self.side = Side(versus.key, snap, knobs, old, self.guide.full_pool)

    # -- the scorecard -------------------------------------------------------------------
    def rows(self) -> list[tuple[str, bool | None]]:
        """Each number the claim names as the claim with the measured numbers in it
        ("TTFT p50 84 ms < guide 6's 648 ms"), and its verdict (None: not yet)."""
        from roseplay.tui.guides.check import NAMES
        mine = self.results.get(self.guide.key)
        theirs = self.results.get(self.guide.versus)
        out = []
        for name, direction, ok in verdicts(self.guide.expect, mine or {}, theirs):
            value = fmt_metric(name, (mine or {}).get(name))
            if direction in (">0", "=0"):
                claim = f"{value} {direction[0]} 0"
            else:
                other = fmt_metric(name, (theirs or {}).get(name))
                op = {"lower": "<", "higher": ">"}.get(direction, f"≤ {NO_LATER:g}x")
                claim = f"{value} {op} {versus_name(self.guide.versus)}'s {other}"
            out.append((f"{NAMES.get(name, name)} {claim}", ok if mine else None))
        return out

    def status(self) -> str:
        """Where the run is: settling (and for what), or measuring (and what it lacks)."""
        side = self.side
        what = f"measuring {versus_name(side.key)}" if self.measuring_versus else "window"
        if side.window is None:
            return f"{what}: settling, waiting for {side.settling(self.last) or 'a step'}"
        w = side.window
        text = (f"{what} clean since step {w.first.step} ({w.seconds():.0f} s; stats reset "
                f"then)")
        if side.unclean:
            text = f"{what} {side.unclean} ({w.seconds():.0f} s)"
        lacking = w.missing(self.expect_of(side.key))
        return text + (f" · needs {lacking[0]}" if lacking else "")

    def versus_hint(self, turn: str | None) -> str:
        """How to measure the other side of a comparison, if it is not measured yet nor
        being measured (after `P` it still said to press `P`)."""
        versus = self.guide.versus
        if not any(d in COMPARED for d in self.guide.expect.values()) or \
                versus in self.results or self.measuring_versus:
            return ""
        if turn:
            return f"for the comparison: {turn} (measures {versus_name(versus)})"
        return f"for the comparison: ? then {versus} runs guide {versus}"


def versus_name(key: str | None) -> str:
    return {"default": "the default", "spec-off": "spec off", "round-robin": "round_robin",
            "least-load": "least_load"}.get(key, f"guide {key}")


def fmt_metric(name: str, value) -> str:
    if value is None:
        return "-"
    if name in ("hit_rate", "kv_used", "mixed_steps", "spec_acceptance"):
        return f"{100 * value:.0f}%"
    if name.startswith(("ttft", "tpot", "itl")):
        return f"{1000 * value:.0f} ms" if value >= 0.1 else f"{1000 * value:.1f} ms"
    if name in ("running", "waiting", "queued", "chunks_p90"):
        return f"{value:.1f}"
    if name == "spec_mean_accepted_len":
        return f"{value:.2f}"
    return f"{value:,.0f}"
