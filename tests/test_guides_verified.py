"""Every guide's claim, checked: its whole setup runs headless on the bundled model on
the CPU (the engine in its own process, the app's 512-block pool) and the numbers it
names move the way it says against its `versus` guide (roseplay/guides.py `expect`).

One engine serves every setup in turn: a guide starts from a clean default (every knob,
an empty queue and prefix cache), so the order does not matter. Each setup gets a short
warm-up and ~2 s of measurement (the directions checked are several-fold on this
engine, far above a loaded machine's noise)."""
from __future__ import annotations

import pytest

from roseplay.cli import TUI_NUM_BLOCKS
from roseplay.guide_check import measure
from roseplay.guides import BASELINES, BY_KEY, GUIDES, POOL_BLOCKS, apply_guide

pytestmark = pytest.mark.timeout(240)

SECONDS, WARMUP = 2.0, 0.8
ALL = {**BY_KEY, **BASELINES}


@pytest.fixture(scope="module")
def results():
    from roseplay.source import start_live
    source = start_live(dict(num_blocks=POOL_BLOCKS), scenario="mixed", concurrency=16,
                        input_len=64, output_len=64, temperature=0.8)
    try:
        out = {}
        for key, guide in ALL.items():
            apply_guide(source, guide)
            out[key] = measure(source, SECONDS, WARMUP)
        yield out
    finally:
        source.close()


def test_the_guides_pool_is_the_apps_default():
    assert POOL_BLOCKS == TUI_NUM_BLOCKS


def test_every_guide_names_what_it_expects_against_a_measured_partner():
    for g in GUIDES:
        assert g.expect and (g.versus in ALL or all(v in (">0", "=0") for v in g.expect.values()))
        if g.versus in BY_KEY:
            assert BY_KEY[g.versus].versus == g.key         # pairs point at each other


@pytest.mark.parametrize("key", [g.key for g in GUIDES])
def test_the_guides_claim_holds_on_this_engine(results, key):
    guide, mine = BY_KEY[key], results[key]
    other = results.get(guide.versus)
    assert mine["finished"] > 0 or mine["tok_s"] > 0, mine
    for name, direction in guide.expect.items():
        value = mine[name]
        if direction == ">0":
            assert value > 0, (key, name, mine)
        elif direction == "=0":
            assert value == 0, (key, name, mine)
        else:
            theirs = other[name]
            assert value is not None and theirs is not None, (key, name, mine, other)
            ok = value < theirs if direction == "lower" else value > theirs
            assert ok, f"guide {key}: {name} {value:.4g} is not {direction} than guide " \
                       f"{guide.versus}'s {theirs:.4g}"
