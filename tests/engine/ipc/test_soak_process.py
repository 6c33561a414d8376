"""Soak through the engine process (EngineClient): ~20 s of churn on a small pool
(preemption, eviction), random cancels and live knob flips, with the engine process's
RSS and thread count sampled every second (scripts/soak.py; run it longer by hand)."""
from __future__ import annotations

import os

import pytest

from tests.helpers import load_script

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_soak_through_the_engine_process_stays_flat():
    soak = load_script("soak")
    res = soak.soak(seconds=float(os.environ.get("ROSEPLAY_SOAK_SECONDS", "20")), sample_every=1.0)
    if os.environ.get("ROSEPLAY_SOAK_REPORT"):
        soak.print_report(res, 20)
    assert not res.errors, res.errors[:3]
    assert res.mismatches == 0 and res.all_free
    assert res.finished > 200 and res.cancelled > 10 and res.flips > 20
    assert res.counters.preemptions > 0 and res.counters.evictions > 0
    flat = soak.flatness(res)
    assert flat["rss_max"] - flat["rss_first"] < 25, flat       # MB, after warm-up
    assert flat["threads_max"] - flat["threads_min"] <= 3, flat
