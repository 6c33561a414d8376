"""The `roseplay` command line: every flag in --help, bench delegated lazily."""
from __future__ import annotations

import subprocess
import sys

import pytest

from roseplay.tui.defaults import TUI_MAX_NUM_SEQS, TUI_NUM_BLOCKS
from roseplay.cli import build_parser
from roseplay.tui.launch import make_source_factory

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
    # the engine runs in its own process by default (--in-process is the option)
    assert "benchmark of the engine (in its own" in " ".join(out.stdout.split())


def test_defaults_and_engine_kwargs():
    args = build_parser().parse_args([])
    # the mixed workload, more in flight than running: a queue for the policy knob
    assert args.scenario == "mixed" and args.concurrency == 32 and args.rate is None
    assert TUI_MAX_NUM_SEQS < args.concurrency
    args = build_parser().parse_args(["--model", "dummy:tiny", "--no-enable-prefix-caching",
                                      "--max-num-batched-tokens", "64"])
    factory, message = make_source_factory(args)
    assert "dummy:tiny" in message and callable(factory)
    from roseplay.cli_flags import engine_kwargs
    kw = engine_kwargs(args)
    assert kw["enable_prefix_caching"] is False and kw["max_num_batched_tokens"] == 64
    assert TUI_NUM_BLOCKS >= 64


BAD_FLAGS = [
    (["--temperature", "-3"], "--temperature: must be >= 0"),
    (["--output-len", "-5"], "--output-len: must be >= 1"),
    (["--input-len", "0"], "--input-len: must be >= 1"),
    (["--rate", "-1"], "--rate: must be > 0"),
    (["--rate", "0"], "--rate: must be > 0"),
    (["--rate", "nan"], "--rate: must be > 0"),
    (["--concurrency", "0"], "--concurrency: must be >= 1"),
    (["--concurrency", "two"], "--concurrency: expected int"),
    (["--replay-speed", "0"], "--replay-speed: must be > 0"),
    (["--max-num-seqs", "0"], "max_num_seqs must be >= 1"),
    (["--scenario", "nope"], "--scenario: invalid choice"),
    (["--model", "nosuch"], "unknown model 'nosuch'"),
    (["--model", "dummy:nope"], "unknown dummy preset 'nope'"),
    (["--record", "/nonexistent-dir/s.jsonl.gz"], "folder /nonexistent-dir does not exist"),
    (["--record", ""], "--record: the path is empty"),
    # flags the session would drop: each was ignored (--in-process won over --connect)
    (["--replay", "s.jsonl.gz", "--record", "r.jsonl.gz"], "--record: --replay plays a recording"),
    (["--replay", "s.jsonl.gz", "--model", "dummy:tiny", "--num-blocks", "8"],
     "--model, --num-blocks: --replay plays a recording back"),
    (["--connect", "tcp://127.0.0.1:9", "--in-process"], "--in-process starts the app's own"),
    (["--connect", "tcp://127.0.0.1:9", "--num-blocks", "64"],
     "num_blocks: engine settings of running engines cannot be set"),
    (["--in-process", "--data-parallel-size", "2"], "need the engine in its own process"),
    (["--output-len", str(2 ** 31)], "--output-len: must be <= 2147483647"),
    (["--seed", str(2 ** 64)], "seed must be an integer in [0, 18446744073709551615]"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    # above the model's, it was lowered without a word; vLLM refuses it
    (["--max-model-len", "1025"], "max_model_len (1025) is greater than the model's maximum"),
    (["--compare", "max_model_len=512,4096"],
     "--compare max_model_len=4096: max_model_len (4096) is greater than the model's"),
    (["--compare", "model=dummy:tiny,default", "--max-model-len", "2048"],
     "--compare model=default: max_model_len (2048) is greater than the model's"),
    (["--connect", "nonsense"], "engine address 'nonsense': expected tcp://HOST:PORT"),
    (["--connect", "tcp://127.0.0.1:9", "--engine-key", "@/nonexistent-key"],
     "cannot read the engine key file /nonexistent-key"),
]


@pytest.mark.parametrize("argv,message", BAD_FLAGS, ids=[" ".join(a) for a, _ in BAD_FLAGS])
def test_each_bad_flag_exits_non_zero_with_one_line(argv, message, capsys, monkeypatch):
    import roseplay.cli as cli
    from engine.ipc.auth import ENGINE_KEY_ENV
    monkeypatch.setenv(ENGINE_KEY_ENV, "")      # main sets it from --engine-key: undone after
    monkeypatch.setattr(cli, "run_tui", lambda args: pytest.fail("the app started"))
    try:
        rc = cli.main(argv)
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith("roseplay: error:") and message in err
    # as argparse's own errors: the checks after parsing left the pointer to --help out
    assert err.endswith(" (see roseplay --help)\n"), err


def test_compare_checks_each_sides_model_not_the_flags(monkeypatch):
    """--compare model=A,B: each side's max_model_len is checked against its own model,
    not against --model's (the bundled one, 1024 positions), which no side runs."""
    import roseplay.cli as cli
    started = []
    monkeypatch.setattr(cli, "run_tui", lambda args: started.append(args.compare) or 0)
    assert cli.main(["--compare", "model=dummy:tiny,dummy:qwen2.5-0.5b",
                     "--max-model-len", "2048"]) == 0
    assert started == [("model", ["dummy:tiny", "dummy:qwen2.5-0.5b"])]


def test_model_directory_without_config_fails_before_loading(tmp_path, capsys):
    from roseplay.cli import main
    assert main(["--model", str(tmp_path)]) == 2
    assert "has no config.json" in capsys.readouterr().err


def test_bench_with_an_unknown_model_prints_one_line():
    out = subprocess.run([sys.executable, "-m", "roseplay", "bench", "--model", "dummy:nope",
                          "--num-prompts", "1"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "unknown dummy preset" in out.stderr and "Traceback" not in out.stderr


def test_start_live_refuses_a_workload_it_would_not_serve():
    from engine.config import InvalidRequestError
    from roseplay.workload.source import start_live
    for bad in (dict(temperature=-3), dict(output_len=-5), dict(rate=0), dict(rate=-1.0),
                dict(concurrency=0), dict(scenario="nope")):
        with pytest.raises(InvalidRequestError):
            start_live({"model": "this is never loaded"}, **bad)


def test_a_model_that_fails_to_load_closes_the_app_with_one_line(monkeypatch, capsys):
    import asyncio

    import roseplay.cli as cli
    from engine.config import InvalidRequestError
    from roseplay.tui import launch
    from roseplay.tui.app import RoseplayApp

    def factory():
        raise InvalidRequestError("cannot fetch model 'org/x' from the hub: offline\nmore")

    def run_headless(app: RoseplayApp) -> None:
        async def go():
            async with app.run_test(size=(80, 24)) as pilot:
                for _ in range(100):
                    if app.return_code is not None:
                        break
                    await pilot.pause(0.05)
            assert app.return_code == 1         # the app closed itself
        asyncio.run(go())

    monkeypatch.setattr(launch, "make_source_factory", lambda args: (factory, "loading"))
    monkeypatch.setattr(RoseplayApp, "run", run_headless)
    assert cli.main(["--model", "org/x"]) == 1
    err = capsys.readouterr().err
    assert err == ("roseplay: error: could not start: InvalidRequestError: cannot fetch model "
                   "'org/x' from the hub: offline\n")


BAD_BENCH_FLAGS = [
    (["--range-ratio", "-1"], "range-ratio: must be >= 0"),
    (["--range-ratio", "1"], "range-ratio: must be in [0, 1)"),
    (["--range-ratio", "nan"], "range-ratio: must be >= 0"),
    (["--submit-interval-ms", "-5"], "--submit-interval-ms: must be >= 0"),
    (["--submit-interval-ms", "nan"], "--submit-interval-ms: must be >= 0"),
    (["--hf-batch-size", "0"], "--hf-batch-size: must be >= 1"),
    (["--num-prompts", "0"], "--num-prompts: must be >= 1"),
    (["--warmup", "-1"], "--warmup: must be >= 0"),
    (["--repeat", "0"], "--repeat: must be >= 1"),
    (["--num-clients", "0"], "--num-clients: must be >= 1"),
    (["--json", "/nonexistent-dir/b.json"], "folder /nonexistent-dir does not exist"),
    (["--ab", "max_num_seqs=1,2", "--compare", "hf"], "use --ab or --compare, not both"),
    # --ab's value is argparse's to refuse, naming the flag (it read '--ab expects ...')
    (["--ab", "foo"], "argument --ab: expected KNOB=V1,V2,..., got 'foo'"),
    (["--ab", "max_num_seqs=4"], "argument --ab: needs at least two values"),
    (["--ab", "max_num_seqs=a,b"], "argument --ab: max_num_seqs expects int, got 'a'"),
    (["--ab", ""], "argument --ab: expected KNOB=V1,V2,..., got ''"),
    (["--ab", "max_num_seqs=1,2", "--base-url", "http://127.0.0.1:9"],
     "--ab and --compare need the in-process engine"),
    (["--ab", "nosuch=1,2"], "argument --ab: unknown knob 'nosuch'"),
    (["--endpoint", "chat"], "--endpoint: HTTP client flags, they need --base-url"),
    (["--api-key", "k", "--num-clients", "2"], "--api-key, --num-clients: HTTP client flags"),
    (["--base-url", "http://127.0.0.1:9", "--tokenizer-free"], "unrecognized arguments"),
    (["--base-url", "http://127.0.0.1:9"], "http://127.0.0.1:9: ConnectError"),
    (["--ab", "num_blocks=64,1"], "--ab num_blocks=1: num_blocks must be an integer >= 2"),
    (["--engine-address", "localhost:5555"], "engine address 'localhost:5555': expected"),
    (["--engine-key", "@/nonexistent-key"], "cannot read the engine key file"),
    (["--engine-address", "tcp://127.0.0.1:5555", "--in-process"],
     "--engine-address binds the engine's own process: not with --in-process"),
    (["--in-process", "--data-parallel-size", "2"], "need the engine in its own process"),
    (["--compare", "hf", "--data-parallel-size", "2"], "--compare hf runs the engine in this"),
    (["--in-process", "--ab", "data_parallel_size=1,2"], "--ab data_parallel_size=2: "),
    (["--engine-address", "tcp://127.0.0.1:9", "--engine-address", "tcp://127.0.0.1:19"],
     "model: engine settings of running engines cannot be set"),
    (["--engine-address", "tcp://127.0.0.1:9", "--engine-address", "tcp://127.0.0.1:19",
      "--data-parallel-size", "3"], "--data-parallel-size 3 conflicts with the 2"),
    # each was a traceback, a failed run (exit 1) or a value silently dropped
    (["--num-prompts", str(10 ** 22)], "--num-prompts: must be <= 10000000"),
    (["--warmup", str(10 ** 22)], "--warmup: must be <= 10000000"),
    (["--output-len", str(2 ** 31)], "--output-len: must be <= 2147483647"),
    (["--temperature", "1e9"], "--temperature: must be <= 10000.0"),
    (["--seed", "-1"], "seed must be >= 0"),
    (["--seed", str(2 ** 64)], "seed must be an integer in [0, 18446744073709551615]"),
    (["--json", ""], "--json: the path is empty"),
    (["--base-url", "http://127.0.0.1:9", "--num-blocks", "8", "--in-process"],
     "--in-process, --num-blocks: the engine's own flags, not with --base-url"),
    (["--base-url", "http://127.0.0.1:9", "--engine-address", "tcp://127.0.0.1:5555"],
     "--engine-address: the engine's own flags, not with --base-url"),
    (["--hf-batch-size", "8"], "--hf-batch-size sets HF's batch: it needs --compare hf"),
    (["--speculative-config", '{"method": "draft_model", "model": "/nonexistent-draft"}'],
     "--speculative-config model: unknown model '/nonexistent-draft'"),
    (["--kv-overlap-score-weight", "nan"], "kv_overlap_score_weight must be int/float >= 0"),
    (["--kv-overlap-score-weight", "inf"], "kv_overlap_score_weight must be int/float >= 0"),
    (["--max-model-len", "4096"], "max_model_len (4096) is greater than the model's maximum "
                                  "(max_position_embeddings=2048"),
    (["--ab", "max_model_len=512,4096"], "--ab max_model_len=4096: max_model_len (4096) is"),
    (["--goodput", "ttft:5", "e2el:9", "ttft:6"],
     "argument --goodput: ttft given more than once (one value per metric)"),
    (["--dataset-name", "sharegpt"], "argument --dataset-name: 'sharegpt' is not built in"),
    (["--host", "127.0.0.1", "--num-blocks", "8"],
     "--num-blocks: the engine's own flags, not with --base-url"),
    # vLLM's result flags: a name without the file, two names for one file, bad values
    (["--result-dir", "/tmp"], "--result-dir: where --save-result writes; give --save-result"),
    (["--save-result", "--json", "/tmp/x.json"],
     "--json PATH and --save-result each name the result file: give one"),
    (["--save-result", "--result-dir", "/nonexistent-dir"],
     "--result-dir /nonexistent-dir: no such folder"),
    (["--metric-percentiles", "0"], "argument --metric-percentiles: each must be in (0, 100]"),
    (["--metric-percentiles", "nan"], "argument --metric-percentiles: each must be in (0, 100]"),
    (["--metric-percentiles", "p99"], "argument --metric-percentiles: expected numbers"),
    (["--percentile-metrics", "ttft,e2e"],
     "argument --percentile-metrics: expected some of ttft,tpot,itl,e2el, got 'ttft,e2e'"),
    # flags under which the engine refuses every request: the run printed 0.00 everywhere
    (["--input-len", "5000"], "--input-len 5000: every prompt has 5000 tokens or more and "
                              "max_model_len is 2048"),
    (["--input-len", "4200", "--range-ratio", "0.5"],
     "--input-len 4200 --range-ratio 0.5: every prompt has 2100 tokens or more"),
    (["--num-blocks", "4", "--input-len", "60", "--output-len", "8"],
     "every request needs 68 tokens or more and --num-blocks 4 holds 64, so the engine would "
     "refuse every request; use --num-blocks 5 or more"),
    (["--ab", "max_model_len=512,1024", "--input-len", "600"],
     "--ab max_model_len=512: --input-len 600: every prompt has 600 tokens or more"),
]


@pytest.mark.parametrize("argv,message", BAD_BENCH_FLAGS,
                         ids=[" ".join(a) for a, _ in BAD_BENCH_FLAGS])
def test_each_bad_bench_flag_exits_2_with_one_line(argv, message, capsys, monkeypatch):
    """A bench flag no run can use: one line on stderr and exit status 2, before any
    engine starts (a traceback, a silently accepted value, or a run whose --json
    cannot be written were each possible)."""
    import roseplay.cli as cli
    from engine.ipc.auth import ENGINE_KEY_ENV
    from roseplay.bench import inproc
    monkeypatch.setenv(ENGINE_KEY_ENV, "")
    monkeypatch.setattr(inproc, "make_loop", lambda *a, **k: pytest.fail("an engine started"))
    try:
        rc = cli.main(["bench", "--model", "dummy:tiny", *argv])
    except SystemExit as exc:
        rc = exc.code
    captured = capsys.readouterr()
    assert rc == 2 and captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith("roseplay bench: error:") and message in captured.err, \
        captured.err
    if "ConnectError" not in message:     # a server not reached is no flag's fault
        assert captured.err.endswith(" (see roseplay bench --help)\n"), captured.err
    assert "Traceback" not in captured.err + captured.out


def test_bench_device_cuda_without_cuda_exits_2(capsys):
    """As the app: --device cuda without a visible device is one line and exit 2 before
    any engine starts (the bench's engine failed to start: exit 1)."""
    import torch
    import roseplay.cli as cli
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    assert cli.main(["bench", "--model", "dummy:tiny", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err == ("roseplay bench: error: --device cuda: no CUDA device is visible here; "
                   "use --device cpu (or auto) (see roseplay bench --help)\n")


def test_seed_is_the_workload_seed_with_running_engines(monkeypatch):
    """--seed seeds the workload an attached app or bench drives: taken with --connect
    and with --engine-address given twice (an engine knob there is refused)."""
    import roseplay.cli as cli
    from engine.ipc.auth import ENGINE_KEY_ENV
    from roseplay.bench.args import add_arguments
    from roseplay.cli_checks import check_bench_config
    monkeypatch.setenv(ENGINE_KEY_ENV, "")
    monkeypatch.setattr(cli, "run_tui", lambda args: 0)
    assert cli.main(["--connect", "tcp://127.0.0.1:9", "--seed", "5"]) == 0
    args = add_arguments(__import__("argparse").ArgumentParser()).parse_args(["--engine-address", "tcp://127.0.0.1:9", "--engine-address",
                              "tcp://127.0.0.1:19", "--seed", "5"])
    assert check_bench_config(args) is None


@pytest.mark.parametrize("argv", [["--input-len", "2047", "--output-len", "64"],
                                  ["--input-len", "3000", "--range-ratio", "0.5"],
                                  ["--num-blocks", "5", "--input-len", "60", "--output-len", "8"],
                                  ["--scenario", "shared-prefix", "--input-len", "5000"]])
def test_a_bench_some_requests_of_which_may_run_is_not_refused(argv):
    """The up-front refusal is for flags under which every request fails: a prompt that
    fits (2047 < 2048), a range reaching below max_model_len, a pool just large enough,
    a scenario whose lengths are its own, each runs (and reports what failed)."""
    import argparse

    from roseplay.bench.args import add_arguments
    from roseplay.cli_checks import check_bench_config
    args = add_arguments(argparse.ArgumentParser()).parse_args(["--model", "dummy:tiny", *argv])
    assert check_bench_config(args) is None
