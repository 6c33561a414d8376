"""Knob guidance: the claims (catalog.py), a guide's run and scorecard (run.py) and the
measurement behind it (check.py). What a guide does in the app (a mixin of the app) is
roseplay/tui/guide_actions.py, above the widgets that draw the guides."""
