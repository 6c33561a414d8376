"""Every flag of the three commands says what it does in --help (README: `roseplay --help`
describes every flag)."""
import argparse

import pytest

from roseplay.bench import inproc as bench
from roseplay.cli import build_parser
from roseplay.serve.cli import build_parser as build_serve_parser


def _bench_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="roseplay bench")
    bench.add_arguments(parser)
    return parser


@pytest.mark.parametrize("command, make", [("roseplay", build_parser),
                                           ("serve", build_serve_parser),
                                           ("bench", _bench_parser)])
def test_every_flag_has_help_text(command, make):
    silent = [a.option_strings[0] for a in make()._actions
              if a.option_strings and not (a.help or "").strip()]
    assert silent == [], f"{command}: flags without help: {silent}"


def test_attention_backend_help_names_every_cpu_that_auto_runs_the_c_layer_on():
    """kernels.default_cpu_backend picks cpu_native with 8-float vectors (AVX2 + FMA + F16C)
    as with 16 (AVX-512); the help named AVX-512 alone."""
    help_text = next(a.help for a in build_parser()._actions
                     if "--attention-backend" in a.option_strings)
    assert "AVX2 + FMA + F16C" in help_text and "AVX-512" in help_text


def test_help_lists_the_key_of_every_live_knob():
    """`roseplay --help`'s key list names each key that turns a live knob (it left out
    h, preemption_mode, and d/D, num_speculative_tokens)."""
    import re

    from roseplay.cli import EPILOG
    from roseplay.tui.keys import KEYS
    missing = [k.display for k in KEYS if k.knob
               and not re.search(rf"(?<!\w){re.escape(k.display)}(?!\w)", EPILOG)]
    assert missing == []
