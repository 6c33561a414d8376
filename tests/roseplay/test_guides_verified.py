"""Every guide's claim, and every headline knob's effect on the app's default workload,
checked: its whole setup runs headless on the bundled model on
the CPU (the engine in its own process, the app's 512-block pool) and the numbers it
names move the way it says against its `versus` guide (roseplay/guides.py `expect`).

One engine serves every setup in turn: a guide starts from a clean default (every knob,
an empty queue and prefix cache), so the order does not matter. Each setup gets a short
warm-up and ~2 s of measurement (the directions checked are several-fold on this
engine, far above a loaded machine's noise)."""
from __future__ import annotations


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
                                  {"mixed_steps": "higher", "chunks_p90": "higher"}),
    "scheduling_policy=priority": ({"scheduling_policy": "priority"}, {"ttft_p50": "lower"}),
    "scheduling_mode=prefill-first": ({"scheduling_mode": "prefill-first"},
                                      {"mixed_steps": "=0"}),
}


class Results(dict):
    """Every setup's numbers, and `again(key, versus)`: both setups measured once more."""

    def __init__(self, source):
        super().__init__()
        self.source = source

    def run(self, key: str) -> dict:
        guide = ALL.get(key) or self.default(key)
        apply_guide(self.source, guide)     # a count that must rise gets twice the time
        slow = ">0" in guide.expect.values()
        self[key] = measure(self.source, SECONDS * (2 if slow else 1), WARMUP)
        return self[key]

    @staticmethod
    def default(key: str) -> Guide:
        knobs = {} if key == "default" else KNOB_EFFECTS[key][0]
        return Guide("default", "", "", "", TUI_SCENARIO, {**DEFAULT, **knobs}, TUI_CONCURRENCY)

    def again(self, key: str, versus: str) -> tuple[dict, dict]:
        return self.run(key), self.run(versus)


@pytest.fixture(scope="module")
def results():
    from roseplay.source import start_live
    source = start_live(dict(num_blocks=POOL_BLOCKS), scenario="mixed", concurrency=16,
                        input_len=64, output_len=64, temperature=0.8)
    try:
        measure(source, 1.5, 0.5)       # the first seconds after a load run slower
        out = Results(source)
        for key in [*ALL, "default", *KNOB_EFFECTS]:
            out.run(key)
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
    check(results, key, guide.expect, guide.versus)


def test_the_default_runs_decodes_and_prefill_chunks_in_one_step(results):
    if results["default"]["mixed_steps"] == 0:
        results.run("default")
    assert results["default"]["mixed_steps"] > 0       # what prefill-first takes away


@pytest.mark.parametrize("knob", list(KNOB_EFFECTS))
def test_each_headline_knob_moves_the_default_workload(results, knob):
    check(results, knob, KNOB_EFFECTS[knob][1], "default")


def check(results: Results, key: str, expect: dict, versus: str) -> None:
    """The named numbers move as claimed; a latency direction that misses is measured once
    more (both setups again) before it fails: noise rarely misses twice, a wrong claim does."""
    problem = misses(key, expect, results[key], results.get(versus), versus)
    if problem and problem[1]:
        problem = misses(key, expect, *results.again(key, versus), versus)
    assert problem is None, problem and problem[0]


def misses(key, expect, mine, other, versus) -> tuple[str, bool] | None:
    """None, or (what missed, whether it is a measured direction worth a second look)."""
    if not (mine["finished"] > 0 or mine["tok_s"] > 0):
        return f"{key}: nothing ran {mine}", True
    for name, direction in expect.items():
        value = mine[name]
        if direction == ">0" and not value > 0:
            return f"{key}: {name} is {value}, not > 0 ({mine})", True
        if direction == "=0" and value != 0:
            return f"{key}: {name} is {value}, not 0 ({mine})", False
        if direction in ("lower", "higher"):
            theirs = other[name]
            if value is None or theirs is None:
                return f"{key}: no {name} ({mine}, {other})", True
            if not (value < theirs if direction == "lower" else value > theirs):
                return (f"{key}: {name} {value:.4g} is not {direction} than {versus}'s "
                        f"{theirs:.4g}", True)
    return None
