"""The `roseplay` command line: every flag in --help, bench delegated lazily."""
from __future__ import annotations

import subprocess
import sys

from roseplay.cli import TUI_NUM_BLOCKS, build_parser, make_source_factory

FLAGS = ("--model", "--device", "--dtype", "--block-size", "--num-blocks",
         "--enable-prefix-caching", "--no-enable-prefix-caching", "--max-num-batched-tokens",
         "--max-num-seqs", "--scenario", "--concurrency", "--rate", "--record", "--replay",
         "--paused")


def test_help_lists_every_flag_and_the_bench_command():
    out = subprocess.run([sys.executable, "-m", "roseplay", "--help"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0
    for flag in FLAGS:
        assert flag in out.stdout, flag
    assert "roseplay bench" in out.stdout and "Token budget of one forward" in out.stdout


def test_bench_subcommand_is_wired():
    out = subprocess.run([sys.executable, "-m", "roseplay", "bench", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--num-prompts" in out.stdout


def test_defaults_and_engine_kwargs():
    args = build_parser().parse_args([])
    assert args.scenario == "shared-prefix" and args.concurrency == 16 and args.rate is None
    args = build_parser().parse_args(["--model", "dummy:tiny", "--no-enable-prefix-caching",
                                      "--max-num-batched-tokens", "64"])
    factory, message = make_source_factory(args)
    assert "dummy:tiny" in message and callable(factory)
    from roseplay.cli_flags import engine_kwargs
    kw = engine_kwargs(args)
    assert kw["enable_prefix_caching"] is False and kw["max_num_batched_tokens"] == 64
    assert TUI_NUM_BLOCKS >= 64
