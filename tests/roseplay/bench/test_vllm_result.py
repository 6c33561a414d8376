"""vLLM bench serve's result options: --save-result's file (vLLM's name, vLLM's flat
fields beside roseplay's), --percentile-metrics / --metric-percentiles in the printed
block and the file, in-process and over HTTP (a stubbed client: no server)."""
from __future__ import annotations

import json
import re

import pytest

from roseplay.bench import inproc as bench
from roseplay.bench.report import RunResult, summarize, times_record
from roseplay.bench.vllm_result import fields

BASE = ["--model", "dummy:tiny", "--num-blocks", "256", "--no-progress", "--warmup", "0",
        "--input-len", "8", "--output-len", "3"]
VLLM_KEYS = {"date", "backend", "model_id", "tokenizer_id", "num_prompts", "request_rate",
             "burstiness", "max_concurrency", "duration", "completed", "failed",
             "total_input_tokens", "total_output_tokens", "request_throughput",
             "request_goodput", "output_throughput", "total_token_throughput"}


def test_save_result_writes_vllms_file_name_and_fields(tmp_path, capsys):
    """`--save-result --result-dir DIR` (a vLLM command line; it was 'unrecognized
    arguments') writes BACKEND-RATEqps-concurrencyN-MODEL-DATE.json holding vLLM's fields,
    which agree with roseplay's summary."""
    rc = bench.main([*BASE, "--num-prompts", "4", "--max-concurrency", "2",
                     "--save-result", "--result-dir", str(tmp_path)])
    out = capsys.readouterr().out.replace("\n", "")       # the console wraps at 80
    (path,) = tmp_path.iterdir()
    assert rc == 0 and f"wrote {path}" in out
    assert re.fullmatch(r"roseplay-infqps-concurrency2-dummy:tiny-\d{8}-\d{6}\.json", path.name)
    data = json.loads(path.read_text())
    assert VLLM_KEYS <= set(data) and data["completed"] == 4 and data["failed"] == 0
    s = data["summary"]
    assert data["request_rate"] == "inf" and data["max_concurrency"] == 2
    assert data["total_output_tokens"] == s["total_output_tokens"] == 12
    for name, ours in (("ttft", "ttft_ms"), ("tpot", "tpot_ms"), ("itl", "itl_ms"),
                       ("e2el", "e2e_ms")):
        assert data[f"mean_{name}_ms"] == pytest.approx(s[ours]["mean"])
        assert data[f"p99_{name}_ms"] == pytest.approx(s[ours]["p99"])
        assert data[f"std_{name}_ms"] >= 0


def test_percentile_flags_shape_the_block_and_the_file(tmp_path, capsys, monkeypatch):
    """--percentile-metrics ttft --metric-percentiles 50,99.9 over HTTP: the block prints
    mean, median, P50 and P99.9 of TTFT alone; the file holds vLLM's keys for them."""
    from roseplay.bench import clients, http
    from roseplay.bench.sse import Outcome

    async def send(http_client, path, body, index, prompt_len):
        t = 100.0 + index
        return Outcome(index, {"prompt_len": 8, "output_len": 3, "ttft": 0.01 * (index + 1),
                               "tpot": 0.002, "e2e": 0.05, "itls": [0.002, 0.002],
                               "arrival_time": t, "last_token_time": t + 0.05})

    monkeypatch.setattr(clients, "send", send)
    monkeypatch.setattr(http, "served_models", lambda url, headers: {"dummy:tiny": 2048})
    monkeypatch.setattr(http, "reset_prefix_cache", lambda url, headers: True)
    monkeypatch.setattr(http, "scrape_counters", lambda url, headers: {})
    monkeypatch.setattr(http.replicas, "scrape",
                        lambda url, headers: {"engines": {}, "routing": None})
    rc = bench.main(["--base-url", "http://127.0.0.1:9", "--model", "dummy:tiny",
                     "--num-prompts", "4", "--input-len", "8", "--output-len", "3",
                     "--warmup", "0", "--no-progress", "--save-result", "--result-dir",
                     str(tmp_path), "--result-filename", "r.json",
                     "--percentile-metrics", "ttft", "--metric-percentiles", "50,99.9"])
    out = capsys.readouterr().out
    assert rc == 0
    for row, value in (("Mean TTFT (ms):", "25.00"), ("Median TTFT (ms):", "25.00"),
                       ("P50 TTFT (ms):", "25.00"), ("P99.9 TTFT (ms):", "39.97")):
        assert f"{row:<40} {value:>10}" in out, row
    assert "TPOT" not in out and "P99 TTFT" not in out and "Inter-token" not in out
    assert "Traffic request rate: inf\nMaximum request concurrency: None\n" in out
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["backend"] == "openai" and data["completed"] == 4
    assert data["p99.9_ttft_ms"] == pytest.approx(39.97) and data["p50_ttft_ms"] == 25.0
    assert data["std_ttft_ms"] == pytest.approx(11.180, abs=1e-3)
    assert not [k for k in data if k.endswith("_tpot_ms")]
    assert data["summary"]["ttft_ms"]["p99.9"] == pytest.approx(39.97)


def test_a_run_without_requests_has_vllms_zeros():
    """Every request failed: each latency field is 0, as vLLM writes (`np.mean(x or 0)`)."""
    import argparse
    args = bench.add_arguments(argparse.ArgumentParser()).parse_args([])
    summary = summarize(RunResult("x", 0.0, [], failed=3))
    d = fields(args, [], summary, "default")
    assert d["completed"] == 0 and d["failed"] == 3
    assert {k: v for k, v in d.items() if k.endswith("_ms")} == {
        f"{stat}_{m}_ms": 0.0 for m in ("ttft", "tpot", "itl", "e2el")
        for stat in ("mean", "median", "std", "p95", "p99")}
    assert summarize(RunResult("x", 1.0, [times_record(4, 0.0, [0.5])]))["ttft_ms"]["p95"] == 500
