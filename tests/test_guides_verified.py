"""Every guide's claim, and every headline knob's effect on the app's default workload,
checked: its whole setup runs headless on the bundled model on
the CPU (the engine in its own process, the app's 512-block pool) and the numbers it
names move the way it says against its `versus` guide (roseplay/guides.py `expect`).

One engine serves every setup in turn: a guide starts from a clean default (every knob,
an empty queue and prefix cache), so the order does not matter. Each setup gets a short
warm-up and ~2 s of measurement (the directions checked are several-fold on this
engine, far above a loaded machine's noise)."""
from __future__ import annotations

import dataclasses

import pytest

from roseplay.cli import TUI_CONCURRENCY, TUI_MAX_NUM_SEQS, TUI_NUM_BLOCKS, TUI_SCENARIO
from roseplay.guide_check import measure
from roseplay.guides import BASELINES, BY_KEY, GUIDES, POOL_BLOCKS, Guide, apply_guide

pytestmark = pytest.mark.timeout(240)

SECONDS, WARMUP = 1.8, 0.8
ALL = {**BY_KEY, **BASELINES}
# the app's default workload (roseplay/cli.py): each headline knob, turned once, against
# the default itself, and the direction it moves within a few seconds
DEFAULT = dict(max_num_seqs=TUI_MAX_NUM_SEQS)
KNOB_EFFECTS = {
    "enable_prefix_caching=False": ({"enable_prefix_caching": False},
                                    {"hit_rate": "=0", "kv_used": "higher"}),
    "max_num_batched_tokens=32": ({"max_num_batched_tokens": 32},
                                  {"mixed_steps": "higher", "ttft_p90": "higher"}),
    "scheduling_policy=priority": ({"scheduling_policy": "priority"}, {"ttft_p50": "lower"}),
    "scheduling_mode=prefill-first": ({"scheduling_mode": "prefill-first"},
                                      {"mixed_steps": "=0"}),
}


@pytest.fixture(scope="module")
def results():
    from roseplay.source import start_live
    source = start_live(dict(num_blocks=POOL_BLOCKS), scenario="mixed", concurrency=16,
                        input_len=64, output_len=64, temperature=0.8)
    try:
        measure(source, 1.5, 0.5)       # the first seconds after a load run slower
        out = {}
        for key, guide in ALL.items():
            apply_guide(source, guide)      # a count that must rise gets twice the time
            slow = ">0" in guide.expect.values()
            out[key] = measure(source, SECONDS * (2 if slow else 1), WARMUP)
        default = Guide("default", "", "", "", TUI_SCENARIO, DEFAULT, TUI_CONCURRENCY)
        for key, (knobs, _) in {"default": ({}, None), **KNOB_EFFECTS}.items():
            apply_guide(source, dataclasses.replace(default, knobs={**DEFAULT, **knobs}))
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
    guide = BY_KEY[key]
    check(key, guide.expect, results[key], results.get(guide.versus), guide.versus)


def test_the_default_runs_decodes_and_prefill_chunks_in_one_step(results):
    assert results["default"]["mixed_steps"] > 0       # what prefill-first takes away


@pytest.mark.parametrize("knob", list(KNOB_EFFECTS))
def test_each_headline_knob_moves_the_default_workload(results, knob):
    check(knob, KNOB_EFFECTS[knob][1], results[knob], results["default"], "the default")


def check(key, expect, mine, other, versus) -> None:
    assert mine["finished"] > 0 or mine["tok_s"] > 0, mine
    for name, direction in expect.items():
        value = mine[name]
        if direction == ">0":
            assert value > 0, (key, name, mine)
        elif direction == "=0":
            assert value == 0, (key, name, mine)
        else:
            theirs = other[name]
            assert value is not None and theirs is not None, (key, name, mine, other)
            ok = value < theirs if direction == "lower" else value > theirs
            assert ok, f"{key}: {name} {value:.4g} is not {direction} than {versus}'s {theirs:.4g}"
