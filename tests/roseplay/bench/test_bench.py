"""roseplay bench: percentile maths, summaries, JSON, A/B table, HF comparison (CPU)."""
from __future__ import annotations

import json
import math

import pytest

from engine.metrics import Summary, goodput, meets_slos, parse_slos, percentile
from roseplay.bench import args as bench_args, inproc as bench
from roseplay.bench.report import RunResult, side_by_side, summarize, times_record, wall_duration

BASE = ["--model", "dummy:tiny", "--num-blocks", "256", "--no-progress"]


def run_bench(capsys, *argv) -> tuple[int, str]:
    rc = bench.main([*BASE, *argv])
    return rc, capsys.readouterr().out


# -- maths -------------------------------------------------------------------------------
def test_percentiles_by_hand():
    ttft = [0.100, 0.010, 0.040, 0.020, 0.030]          # sorted: 10 20 30 40 100 ms
    # linear interpolation at position (n - 1) * q / 100
    assert percentile(ttft, 50) == pytest.approx(0.030)                  # pos 2
    assert percentile(ttft, 95) == pytest.approx(0.040 + 0.8 * 0.060)   # pos 3.8 -> 88 ms
    assert percentile(ttft, 99) == pytest.approx(0.040 + 0.96 * 0.060)  # pos 3.96 -> 97.6 ms
    assert percentile([1.0, 2.0], 25) == pytest.approx(1.25)
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))
    s = Summary.of(ttft + [None])
    assert (s.count, s.mean, s.max) == (5, pytest.approx(0.040), 0.100)


def test_summary_of_hand_made_run():
    # two requests arriving at t=0; tokens at (1, 2, 4) and (3, 4); duration 4 s
    recs = [times_record(10, 0.0, [1.0, 2.0, 4.0]), times_record(30, 0.0, [3.0, 4.0])]
    assert recs[0]["itls"] == [1.0, 2.0] and recs[0]["tpot"] == 1.5 and recs[1]["ttft"] == 3.0
    assert wall_duration(recs) == 4.0
    s = summarize(RunResult("x", wall_duration(recs), recs))
    assert s["total_input_tokens"] == 40 and s["total_output_tokens"] == 5
    assert s["request_throughput"] == 0.5 and s["output_throughput"] == 1.25
    assert s["total_token_throughput"] == 45 / 4
    assert s["ttft_ms"]["mean"] == 2000 and s["ttft_ms"]["median"] == 2000
    assert s["ttft_ms"]["p99"] == pytest.approx(1000 + 0.99 * 2000)
    assert s["itl_ms"]["count"] == 3                     # pooled: 1, 2, 1 s
    assert s["itl_ms"]["median"] == 1000 and s["itl_ms"]["mean"] == pytest.approx(4000 / 3)
    assert s["tpot_ms"]["mean"] == pytest.approx(1250)   # (1.5 + 1.0) / 2
    assert s["e2e_ms"]["median"] == 4000


def test_side_by_side_ratios():
    from rich.console import Console
    mk = lambda d: summarize(RunResult("r", d, [times_record(4, 0.0, [d / 2, d])]))
    table = side_by_side("t", ["a", "b"], [mk(1.0), mk(2.0)])
    console = Console(width=200, record=True)
    console.print(table)
    text = console.export_text()
    assert "(x0.50)" in text and "(x2.00)" in text     # throughput halves, latency doubles


def test_parse_ab():
    assert bench_args.parse_ab("max-num-batched-tokens=8192,224") == ("max_num_batched_tokens", [8192, 224])
    assert bench_args.parse_ab("enable_prefix_caching=true,false") == ("enable_prefix_caching", [True, False])
    for bad in ("max_num_seqs=4", "nope=1,2", "max_num_seqs", "max_num_seqs=0,1"):
        with pytest.raises(ValueError):
            bench_args.parse_ab(bad)



def test_goodput_by_hand():
    # (ttft, tpot, e2el) in s; SLOs in ms
    reqs = [(0.10, 0.020, 1.0),     # meets all
            (0.30, 0.020, 1.0),     # TTFT 300 > 200
            (0.10, 0.060, 1.0),     # TPOT 60 > 50
            (0.10, None, 0.1),      # one output token: no TPOT, meets a TPOT SLO
            (0.20, 0.050, 2.0),     # exactly on TTFT and TPOT: meets them (<=), E2EL 2 s
            (None, None, None)]     # no token at all: meets none
    slos = parse_slos(["ttft:200", "tpot:50"])
    assert slos == {"ttft": 200.0, "tpot": 50.0}
    assert goodput(reqs, slos, 4.0) == (3, 0.75)          # requests 0, 3, 4 per 4 s
    assert goodput(reqs, {**slos, "e2el": 1500}, 4.0) == (2, 0.5)   # request 4: 2 s > 1.5 s
    assert goodput(reqs, {"e2el": 1000}, 2.0) == (4, 2.0)
    assert meets_slos(0.1, 0.02, 1.0, {}) and not meets_slos(None, None, None, {})
    for bad in (["ttft"], ["itl:5"], ["ttft:0"], ["ttft:-1"], ["tpot:x"], ["e2el:inf"]):
        with pytest.raises(ValueError):
            parse_slos(bad)


def test_goodput_in_summary_and_table():
    # tokens at (1, 2, 4): TTFT 1 s, TPOT 1.5 s; (3, 4): TTFT 3 s, TPOT 1 s; duration 4 s
    recs = [times_record(10, 0.0, [1.0, 2.0, 4.0]), times_record(30, 0.0, [3.0, 4.0])]
    run = RunResult("x", wall_duration(recs), recs)
    s = summarize(run, {"ttft": 2000})
    assert (s["good_requests"], s["request_goodput"]) == (1, 0.25)
    assert s["goodput_slos_ms"] == {"ttft": 2000}
    assert summarize(run, {"ttft": 3000, "tpot": 1000})["good_requests"] == 1   # 2nd only
    assert "request_goodput" not in summarize(run)
    from rich.console import Console
    console = Console(width=200, record=True)
    console.print(side_by_side("t", ["a", "b"], [s, summarize(run, {"ttft": 3000})]))
    text = console.export_text()
    row = next(line for line in text.splitlines() if "Request goodput (req/s)" in line)
    assert "0.25" in row and "0.50 (x2.00)" in row

# -- end to end on dummy:tiny --------------------------------------------------------------
def test_bench_block_and_json(tmp_path, capsys):
    path = tmp_path / "out.json"
    rc, out = run_bench(capsys, "--num-prompts", "12", "--input-len", "24", "--output-len", "6",
                        "--range-ratio", "0.25", "--warmup", "3", "--max-concurrency", "5",
                        "--json", str(path))
    assert rc == 0
    for line in ("Serving Benchmark Result", "Successful requests:", "Benchmark duration (s):",
                 "Total input tokens:", "Total generated tokens:", "Request throughput (req/s):",
                 "Output token throughput (tok/s):", "Total token throughput (tok/s):",
                 "Median TTFT (ms):", "P99 TPOT (ms):", "P95 ITL (ms):", "Mean E2EL (ms):",
                 "Prefix cache hit rate", "Preemptions:", "Evictions:", "COW copies:",
                 "Peak KV usage"):
        assert line in out, line
    data = json.loads(path.read_text())
    assert {"bench", "summary", "requests", "runs"} <= set(data)
    s, reqs = data["summary"], data["requests"]
    assert s["successful_requests"] == 12 == len(reqs)            # warm-up excluded
    assert {"ttft", "tpot", "itls", "e2e", "prompt_len", "output_len"} <= set(reqs[0])
    assert s["total_output_tokens"] == sum(r["output_len"] for r in reqs)
    assert s["total_input_tokens"] == sum(r["prompt_len"] for r in reqs)
    assert all(18 <= r["prompt_len"] <= 30 and 4 <= r["output_len"] <= 7 for r in reqs)
    assert all(len(r["itls"]) == r["output_len"] - 1 for r in reqs)
    assert s["itl_ms"]["count"] == sum(len(r["itls"]) for r in reqs)
    assert all(0 < r["ttft"] <= r["e2e"] for r in reqs)
    assert s["engine"]["peak_used_blocks"] > 0 and s["engine"]["num_blocks"] == 256
    steps = data["runs"][0]["steps"]                # the run's engine steps, warm-up excluded
    assert len(steps) == s["engine"]["steps"] and steps[0]["t"] == steps[0]["dt"] == 0
    assert [x["step"] for x in steps] == list(range(steps[0]["step"], steps[-1]["step"] + 1))
    assert sum(x["decode_tokens"] + x["prefill_tokens"] for x in steps) == \
        s["engine"]["decode_tokens"] + s["engine"]["prefill_tokens"]
    assert all(x["dt"] >= 0 and x["duration"] > 0 for x in steps)


@pytest.mark.slow
def test_bench_arrival_interval(tmp_path, capsys):
    path = tmp_path / "o.json"
    rc, out = run_bench(capsys, "--num-prompts", "5", "--input-len", "8", "--output-len", "2",
                        "--submit-interval-ms", "40", "--json", str(path),
                        "--goodput", "ttft:60000", "e2el:60000", "tpot:0.001")
    assert rc == 0 and "Request goodput (req/s):" in out
    data = json.loads(path.read_text())
    # every request has 2 tokens, so a TPOT > 1 us: none meets tpot:0.001
    assert data["summary"]["good_requests"] == 0 and data["summary"]["request_goodput"] == 0
    assert data["summary"]["goodput_slos_ms"] == {"ttft": 60000, "e2el": 60000, "tpot": 0.001}
    arr = [r["arrival_time"] for r in data["requests"]]
    assert all(b > a for a, b in zip(arr, arr[1:])) and arr[-1] - arr[0] >= 4 * 0.04 * 0.9


def test_burstiness_is_taken_as_vllm_bench_serve_takes_it(tmp_path, capsys):
    """--burstiness (vLLM's name: the gamma shape of --request-rate's gaps) is a flag of
    the bench, recorded in --json; a vLLM command line with it was 'unrecognized
    arguments'. Without a rate it shapes nothing: refused, as other flags that would be
    ignored."""
    path = tmp_path / "b.json"
    rc, out = run_bench(capsys, "--num-prompts", "4", "--input-len", "8", "--output-len", "2",
                        "--warmup", "0", "--request-rate", "200", "--burstiness", "0.5",
                        "--json", str(path))
    assert rc == 0 and "Successful requests:" in out
    # the arrival process, as vLLM's bench prints it before the run
    assert ("Traffic request rate: 200\nBurstiness factor: 0.5 (Gamma distribution)\n"
            "Maximum request concurrency: None\n") in out
    assert json.loads(path.read_text())["bench"]["burstiness"] == 0.5
    assert bench.main([*BASE, "--burstiness", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "--burstiness shapes the gaps of --request-rate" in err
    with pytest.raises(SystemExit):
        bench.main([*BASE, "--request-rate", "5", "--burstiness", "0"])


@pytest.mark.slow
def test_ab_prefix_caching_on_shared_prefix(tmp_path, capsys):
    path = tmp_path / "ab.json"
    rc, out = run_bench(capsys, "--scenario", "shared-prefix", "--num-prompts", "16",
                        "--input-len", "64", "--output-len", "4",
                        "--ab", "enable_prefix_caching=true,false", "--json", str(path))
    assert rc == 0
    assert "True" in out and "False" in out and "(x" in out and "Prefix hit rate" in out
    data = json.loads(path.read_text())
    assert data["ab"]["mode"].startswith("same engine")
    rates = [r["summary"]["engine"]["prefix_hit_rate"] for r in data["runs"]]
    assert rates[0] > 0 and rates[1] == 0
    assert [r["knobs"]["enable_prefix_caching"] for r in data["runs"]] == [True, False]
    assert all(len(r["requests"]) == 16 for r in data["runs"])


@pytest.mark.slow
def test_ab_fixed_knob_uses_fresh_engines(tmp_path, capsys):
    path = tmp_path / "ab.json"
    rc, _ = run_bench(capsys, "--num-prompts", "4", "--input-len", "20", "--output-len", "3",
                      "--ab", "block_size=8,16", "--json", str(path))
    data = json.loads(path.read_text())
    assert rc == 0 and data["ab"]["mode"] == "fresh engine per value"
    assert [r["summary"]["total_output_tokens"] for r in data["runs"]] == [12, 12]


def test_identical_scenario_exercises_cow(tmp_path, capsys):
    path = tmp_path / "cow.json"
    rc, _ = run_bench(capsys, "--in-process", "--scenario", "identical", "--num-prompts", "8",
                      "--input-len", "65", "--output-len", "3", "--json", str(path))
    assert rc == 0
    eng = json.loads(path.read_text())["summary"]["engine"]
    assert eng["dedup_joined"] == 7          # one prefill, 7 followers share its blocks
    assert eng["cow_copies"] == 7            # each follower copies the shared last block


@pytest.mark.slow
def test_compare_hf_same_weights(tmp_path, capsys):
    path = tmp_path / "cmp.json"
    rc, out = run_bench(capsys, "--num-prompts", "6", "--input-len", "12", "--output-len", "5",
                        "--range-ratio", "0.3", "--compare", "hf", "--hf-batch-size", "4",
                        "--json", str(path))
    assert rc == 0
    assert "HF CB" in out and "HF generate" in out and "roseplay / HF CB" in out
    data = json.loads(path.read_text())
    labels = [r["label"] for r in data["runs"]]
    assert labels[0] == "roseplay" and labels[1].startswith("HF CB")
    outs = [[r["output_len"] for r in run["requests"]] for run in data["runs"]]
    assert outs[0] == outs[1] == outs[2]                 # same max_tokens everywhere
    assert data["compare"]["greedy_agreement_vs_hf_cb"] == 1.0   # identical weights, fp32


def test_bad_args_return_2(capsys):
    with pytest.raises(SystemExit) as exc:          # argparse's own error: the flag's type
        bench.main([*BASE, "--num-prompts", "0"])
    assert exc.value.code == 2
    # one line, as `roseplay bench` prints it (`python -m roseplay.bench.inproc` printed
    # argparse's usage block)
    assert capsys.readouterr().err == ("roseplay bench: error: argument --num-prompts: must "
                                       "be >= 1, got 0 (see roseplay bench --help)\n")
    assert bench.main([*BASE, "--ab", "max_num_seqs=1,2", "--compare", "hf"]) == 2


def test_ab_eviction_policy_reports_block_residency(tmp_path, capsys):
    """A choice-valued live knob in --ab; the JSON's kv_block residency counts every
    eviction of the run (each evicted block has one lifetime and one idle time)."""
    path = tmp_path / "lfu.json"
    rc, out = run_bench(capsys, "--in-process", "--scenario", "shared-prefix",
                        "--num-prompts", "12", "--input-len", "64", "--output-len", "4",
                        "--num-blocks", "24", "--ab", "eviction_policy=lru,lfu",
                        "--json", str(path))
    assert rc == 0 and "KV block lifetime p50 (s)" in out
    runs = json.loads(path.read_text())["runs"]
    assert [r["knobs"]["eviction_policy"] for r in runs] == ["lru", "lfu"]
    for r in runs:
        eng = r["summary"]["engine"]
        blocks = eng["kv_block"]
        assert eng["evictions"] > 0
        assert blocks["lifetime"]["count"] == blocks["idle_before_evict"]["count"] == eng["evictions"]
        assert 0 < blocks["lifetime"]["p50_s"] and blocks["idle_before_evict"]["mean_s"] <= \
            blocks["lifetime"]["mean_s"]


def test_json_leaves_the_secrets_out(tmp_path, capsys):
    """--json records the flags but never the engine key or the API key: a result file
    is shared, the keys are not."""
    path = tmp_path / "k.json"
    rc, _ = run_bench(capsys, "--num-prompts", "2", "--input-len", "4", "--output-len", "2",
                      "--warmup", "0", "--engine-key", "s3cret-engine-key", "--json", str(path))
    assert rc == 0
    text = path.read_text()
    assert "s3cret-engine-key" not in text
    assert json.loads(text)["bench"]["num_prompts"] == 2
    ns = bench_args.add_arguments(__import__("argparse").ArgumentParser()).parse_args(
        ["--api-key", "s3cret-api-key", "--engine-key", "k"])
    assert not {"api_key", "engine_key", "func"} & set(bench_args.recorded_args(ns))


def test_requests_that_end_in_an_error_are_explained(capsys, monkeypatch):
    """A request the engine runs and fails (here: every forward raises) is counted and
    its error printed; only the errors of requests refused at submit were printed, so
    such a run reported 'Failed requests: 4' and nan with no reason."""
    from engine.core.core import LLMEngine

    def broken(self, plan):
        raise RuntimeError("the forward broke")

    monkeypatch.setattr(LLMEngine, "_launch", broken)
    rc = bench.main([*BASE, "--in-process", "--num-prompts", "4", "--input-len", "8",
                     "--output-len", "2", "--warmup", "0"])
    captured = capsys.readouterr()
    assert rc == 1 and "Failed requests:                                  4" in captured.out
    # no request made a token: every rate is 0 (it printed nan)
    assert "nan" not in captured.out.lower()
    assert f"{'Request throughput (req/s):':<40} {'0.00':>10}" in captured.out
    assert "request failed:" in captured.err and "the forward broke" in captured.err


def test_repeat_prints_every_run_and_records_the_last(tmp_path, capsys):
    """--repeat N prints each run's report (only the first was printed, while the HTTP
    bench prints all) and --json's summary is the last run's, as the HTTP bench's."""
    path = tmp_path / "r.json"
    rc, out = run_bench(capsys, "--num-prompts", "3", "--input-len", "8", "--output-len", "2",
                        "--warmup", "0", "--repeat", "2", "--json", str(path))
    assert rc == 0 and out.count("Serving Benchmark Result") == 2
    assert "run 1/2" in out and "run 2/2" in out
    data = json.loads(path.read_text())
    assert data["summary"] == data["runs"][-1]["summary"]
    assert data["requests"] == data["runs"][-1]["requests"]


def test_vllm_bench_serve_flag_names_are_taken():
    """vLLM's `bench serve` spellings of the random dataset's lengths and of the progress
    bar name the same settings (a vLLM command line was 'unrecognized arguments')."""
    import argparse
    parser = bench_args.add_arguments(argparse.ArgumentParser())
    ns = parser.parse_args(["--random-input-len", "12", "--random-output-len", "3",
                            "--random-range-ratio", "0.5", "--disable-tqdm"])
    assert (ns.input_len, ns.output_len, ns.range_ratio, ns.no_progress) == (12, 3, 0.5, True)
    ns = parser.parse_args([])
    assert (ns.input_len, ns.output_len, ns.range_ratio, ns.no_progress) == (128, 64, 0.0, False)
    with pytest.raises(SystemExit):
        parser.parse_args(["--random-input-len", "0"])



def test_a_vllm_bench_serve_command_line_is_taken():
    """vLLM's --endpoint paths, --backend, --dataset-name random, --ignore-eos and --host / --port
    (a vLLM command line was 'unrecognized arguments' or 'invalid choice'); its datasets
    that are not built in are refused, naming the scenarios."""
    import argparse
    parser = bench_args.add_arguments(argparse.ArgumentParser())
    ns = parser.parse_args(["--endpoint", "/v1/chat/completions", "--dataset-name", "random",
                            "--ignore-eos", "--host", "localhost", "--port", "8001"])
    bench_args.check_args(ns)
    assert (ns.endpoint, ns.scenario, ns.base_url) == ("chat", "random", "http://localhost:8001")
    ns = parser.parse_args(["--port", "9000"])
    bench_args.check_args(ns)
    assert ns.base_url == "http://127.0.0.1:9000"
    assert parser.parse_args(["--endpoint", "/v1/completions"]).endpoint == "completions"
    assert [parser.parse_args(["--backend", b]).endpoint
            for b in ("vllm", "openai", "openai-chat")] == ["completions", "completions", "chat"]
    for bad in (["--dataset-name", "sharegpt"], ["--endpoint", "/v1/embeddings"],
                ["--port", "0"], ["--backend", "tgi"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)
    ns = parser.parse_args(["--port", "9000", "--base-url", "http://127.0.0.1:8000"])
    with pytest.raises(ValueError, match="--host / --port and --base-url each name the server"):
        bench_args.check_args(ns)


def test_one_output_token_shows_tpot_and_itl_as_vllm(tmp_path, capsys):
    """--output-len 1 leaves no gap between tokens: TPOT and ITL print 0.00 and --json
    holds 0 with count 0, as vLLM's bench (`np.mean(tpots or 0)`); they printed nan and
    the JSON held null."""
    path = tmp_path / "one.json"
    rc, out = run_bench(capsys, "--num-prompts", "3", "--input-len", "8", "--output-len", "1",
                        "--warmup", "0", "--json", str(path))
    assert rc == 0 and "nan" not in out.lower()
    for short in ("TPOT", "ITL"):
        for stat in ("Mean", "Median", "P95", "P99"):
            assert f"{f'{stat} {short} (ms):':<40} {'0.00':>10}" in out
    s = json.loads(path.read_text())["summary"]
    for key in ("tpot_ms", "itl_ms"):
        assert s[key] == {"mean": 0.0, "median": 0.0, "p95": 0.0, "p99": 0.0, "max": 0.0,
                          "count": 0}
    assert s["ttft_ms"]["count"] == 3 and s["ttft_ms"]["mean"] > 0
