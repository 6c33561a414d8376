"""What a guide does in the app (a mixin of RoseplayApp, through Actions): a digit on
the help screen switches the engine to the guide's setup and starts its scorecard
(roseplay/tui/guides/run.py); each frame feeds it; a user's change either turns the setup
into the guide's versus (measured next) or ends it."""
from __future__ import annotations

from engine.config import InvalidRequestError
from roseplay.workload.source import ReadOnlyError
from roseplay.tui.widgets.knobs import KnobsPanel

MESSAGE_SECONDS = 6.0    # a guide's "watch" line on the message line


class GuideActions:
    def pick_guide(self, key: str | None) -> None:
        """A digit on the help screen: switch to that guide's setup."""
        from roseplay.tui.guides.catalog import apply_guide, find
        guide = find(key) if key else None
        if guide is None or self.source is None:
            return
        record = getattr(self.source, "record_event", None)
        if record is not None:      # before its changes: a replay marks the guide alone
            record("guide", key=key)
        skipped = self._control(apply_guide, self.source, guide, knob="scenario",
                                label=f"guide {key}")
        if skipped is not None:
            fixed = getattr(self.source, "knob", None)
            why = "this view compares it" if skipped == [fixed] else "not a knob here"
            note = f" (skipped {', '.join(skipped)}: {why})" if skipped else ""
            self.start_guide(guide)
            self.notify(f"guide {key}: {guide.watch}{note}", title=guide.scenario,
                        timeout=MESSAGE_SECONDS)

    # -- a running guide: its scorecard (roseplay/tui/guides/run.py) ------------------------------
    def start_guide(self, guide) -> None:
        """Totals and the 10 s figures from a clean start (the plots go on: their
        `▲guide` mark shows the change), the guide's view of the request list (from its
        top), and its scorecard in the Knobs panel (the app's main screen only)."""
        from roseplay.tui.guides.run import GuideRun
        from roseplay.tui.guides.catalog import clean_knobs
        self.reset_windows()
        if not isinstance(self.knobs, KnobsPanel):
            return
        self.requests.sort = guide.view.get("sort", "arrival")
        if guide.view:          # its view's top is what it asks to watch: the list follows
            self.requests.select(None)   # it (a typed prompt, selected, kept it scrolled
            #                              to that finished row, below the prefilling ones)
        self.knobs.guide_run = GuideRun(guide, self.source.snapshot(), clean_knobs(guide),
                                        self.guide_results)

    def guide_turned(self) -> None:
        """A user's knob or workload change: if it turns the running guide's setup into
        its versus, that setup starts clean and the guide measures it; else the guide
        ends (its results stay)."""
        run = getattr(self.knobs, "guide_run", None)
        if run is None or self.source is None:
            return
        from roseplay.tui.guides.catalog import live_names
        knobs, w = self.source.knobs, self.source.workload()
        setup = {**{n: getattr(knobs, n) for n in sorted(live_names())},
                 "scenario": w.get("scenario"), "concurrency": w.get("concurrency"),
                 "rate": w.get("rate")}
        if w.get("routing_policy"):
            setup["routing"] = w["routing_policy"]
        versus = run.turned(setup)
        if versus is None:
            self.knobs.guide_run = None
            return
        from roseplay.tui.guides.catalog import apply_guide, clean_knobs
        if not run.guide.full_pool:             # a clean start, as the tests measure it
            record = getattr(self.source, "record_event", None)
            if record is not None:              # a replay marks it as the live app does
                record("guide", key=versus.key)
            try:
                apply_guide(self.source, versus)
            except (InvalidRequestError, ReadOnlyError) as exc:
                self.notify(str(exc), severity="warning", timeout=4)
                self.knobs.guide_run = None
                return
            self.mark_change(f"guide {versus.key}")
        self.reset_windows()
        run.measure_versus(versus, self.source.snapshot(), clean_knobs(versus))

    def feed_guide(self, snap) -> None:
        """Each frame: the running guide's window; the stats reset once it is clean."""
        run = getattr(self.knobs, "guide_run", None)
        if run is not None and run.feed(snap):
            self.reset_windows()
