"""Knob guidance: the claims (catalog.py), what a guide does in the app (actions.py), its
run and scorecard (run.py) and the measurement behind it (check.py)."""
