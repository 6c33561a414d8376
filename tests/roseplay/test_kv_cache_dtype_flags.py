"""--kv-cache-dtype and --calculate-kv-scales: one flag each in `roseplay`, `roseplay
serve` and `roseplay bench`, built from engine/config.py's fields (help text included),
and refused there once: a bad value by argparse's choices, fp8 with the cpu_native
backend by EngineConfig, whichever command or the LLM(...) keyword asks."""
from __future__ import annotations

import pytest

from engine import LLM
from engine.config import InvalidRequestError
from roseplay.cli_flags import engine_kwargs


def _parsers():
    from roseplay.serve.cli import build_parser as serve_parser
    from tests.engine.test_config_owners import _parsers as tui_and_bench
    return {**tui_and_bench(), "serve": serve_parser()}


@pytest.mark.parametrize("command", ["roseplay", "serve", "bench"])
def test_every_command_takes_the_flags_with_their_help(command, capsys):
    parser = _parsers()[command]
    help_text = " ".join(parser.format_help().split())
    assert "--kv-cache-dtype {auto,fp8,fp8_e4m3}" in help_text
    assert "float8 e4m3 blocks with a scale per layer and KV head" in help_text
    assert "--calculate-kv-scales, --no-calculate-kv-scales" in help_text
    args = parser.parse_args(["--kv-cache-dtype", "fp8", "--calculate-kv-scales"])
    kw = engine_kwargs(args)
    assert (kw["kv_cache_dtype"], kw["calculate_kv_scales"]) == ("fp8", True)
    assert "kv_cache_dtype" not in engine_kwargs(parser.parse_args([]))   # the config's default
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-cache-dtype", "fp16"])
    assert "kv_cache_dtype must be one of auto, fp8, fp8_e4m3, got 'fp16'" in capsys.readouterr().err


def test_fp8_with_cpu_native_is_refused_before_anything_starts(capsys):
    from roseplay.cli import check_engine
    from roseplay.serve.cli import main as serve_main
    flags = ["--model", "dummy:tiny", "--device", "cpu", "--kv-cache-dtype", "fp8",
             "--attention-backend", "cpu_native"]
    why = check_engine(_parsers()["roseplay"].parse_args(flags))
    assert why and "cpu_native" in why
    assert serve_main(["--in-process", *flags]) == 2
    assert "kv_cache_dtype fp8 needs another attention_backend" in capsys.readouterr().err
    with pytest.raises(InvalidRequestError, match="kv_cache_dtype must be one of"):
        LLM(model="dummy:tiny", device="cpu", kv_cache_dtype="fp16")
