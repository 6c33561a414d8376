"""Facts with one owner: the engine's start-time defaults (engine/config.py), the live
eviction policy (Scheduler.knobs), the workload flags of `roseplay` and `roseplay bench`
(roseplay/workload/flags.py) and the prefix-hit-rate formula (engine/metrics.py)."""
import argparse
import re

import pytest

from engine.config import DEFAULT_CPU_BLOCKS, DEFAULT_MAX_MODEL_LEN, SchedulerConfig
from engine.core.kv.block_pool import BlockPool
from engine.metrics import prefix_hit_rate
from engine.core.scheduler import Scheduler
from engine.core.kv.counters import Counters
from roseplay.workload.flags import WORKLOAD_DEFAULTS

TINY_POSITIONS = 2048        # dummy:tiny's max_position_embeddings (engine/worker/models/presets.py)


@pytest.mark.timeout(120)
def test_engine_process_defaults_come_from_the_config():
    """The engine process (the default path) sizes a CPU pool and max_model_len from the
    constants in engine/config.py (a max_model_len above the model's is refused:
    tests/engine/test_max_model_len.py)."""
    from engine.front.client import EngineClient
    with EngineClient(model="dummy:tiny", device="cpu", snapshots=False) as client:
        assert client.info.num_blocks == DEFAULT_CPU_BLOCKS
        assert client.info.max_model_len == min(DEFAULT_MAX_MODEL_LEN, TINY_POSITIONS)


def test_max_model_len_help_names_its_cap():
    from roseplay.cli import build_parser
    help_text = build_parser().format_help()
    assert f"capped at {DEFAULT_MAX_MODEL_LEN}" in " ".join(help_text.split())


def test_scheduler_knobs_set_the_pools_eviction_policy():
    counters = Counters()
    pool = BlockPool(8, 4, counters)
    sched = Scheduler(SchedulerConfig(eviction_policy="lfu"), pool, counters)
    assert pool.eviction_policy == "lfu"
    sched.knobs = sched.knobs.replace(eviction_policy="lru")
    assert pool.eviction_policy == "lru"
    sched.schedule()                               # a step leaves the policy alone
    assert pool.eviction_policy == "lru"


def _parsers() -> dict[str, argparse.ArgumentParser]:
    from roseplay.bench import inproc as bench
    from roseplay.cli import OneLineParser, build_parser
    top = OneLineParser(prog="roseplay")
    bench.add_parser(top.add_subparsers(dest="command", required=True,
                                        parser_class=OneLineParser))
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return {"roseplay": build_parser(), "bench": sub.choices["bench"]}


@pytest.mark.parametrize("command", sorted(WORKLOAD_DEFAULTS))
def test_workload_flags_take_their_commands_defaults(command):
    d = WORKLOAD_DEFAULTS[command]
    parser = _parsers()[command]
    args = parser.parse_args([])
    cap = d.concurrency_flag.lstrip("-").replace("-", "_")
    rate = d.rate_flag.lstrip("-").replace("-", "_")
    assert (args.scenario, args.input_len, args.output_len, args.temperature) == \
        (d.scenario, d.input_len, d.output_len, d.temperature)
    assert getattr(args, cap) == d.concurrency and getattr(args, rate) is None
    assert getattr(parser.parse_args([d.rate_flag, "inf"]), rate) is None    # no limit
    assert getattr(parser.parse_args([d.rate_flag, "2.5"]), rate) == 2.5
    for bad in (["--input-len", "0"], [d.rate_flag, "0"], [d.concurrency_flag, "0"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)


def test_both_commands_describe_the_shared_flags_alike():
    """One definition: the same flags with the same help, but for each default."""
    helps = {}
    shared = {"--scenario", "--input-len", "--output-len", "--temperature"}
    for command, parser in _parsers().items():
        helps[command] = {a.option_strings[0]: re.sub(r"\(default: [^)]*\)", "", a.help)
                          for a in parser._actions
                          if a.option_strings and a.option_strings[0] in shared}
        assert set(helps[command]) == shared, command
        assert WORKLOAD_DEFAULTS[command].concurrency_flag in parser.format_help()
    assert helps["roseplay"] == helps["bench"]


def test_prefix_hit_rate_is_none_without_lookups():
    assert prefix_hit_rate(30, 120) == 0.25
    assert prefix_hit_rate(0, 0) is None
