"""`roseplay bench --base-url` against `roseplay serve` (CPU, 127.0.0.1): the same workload
as the in-process bench (same prompts token for token), every request measured from its
stream, the API key passed, chat through the template, clear failures, and the CI-sized
HTTP-vs-direct comparison on the bundled model (engine in its own process both ways)."""
from __future__ import annotations

import json

import pytest

from engine.front.client import EngineClient
from engine.front.loop import EngineLoop
from roseplay.bench import inproc as bench
from roseplay.serve.app import ServeConfig, build_app
from roseplay.serve.server import ServerThread

pytestmark = pytest.mark.slow       # the long tier: `pytest --run-slow` (README)

KEY = "sk-bench"
WORKLOAD = ["--scenario", "random", "--num-prompts", "8", "--input-len", "16",
            "--output-len", "4", "--warmup", "2", "--no-progress"]


@pytest.fixture(scope="module")
def dummy_server():
    with EngineLoop(model="dummy:tiny", device="cpu", num_blocks=128) as loop, \
            ServerThread(build_app(loop, ServeConfig(api_key=KEY))) as srv:
        yield srv


def run_json(tmp_path, capsys, *argv) -> tuple[int, dict | None, str]:
    path = tmp_path / "out.json"
    rc = bench.main([*WORKLOAD, "--json", str(path), *argv])
    captured = capsys.readouterr()       # the report on stdout, an error line on stderr
    return rc, (json.loads(path.read_text()) if path.exists() else None), \
        captured.out + captured.err


def test_http_bench_matches_the_in_process_workload(dummy_server, tmp_path, capsys):
    rc, http, out = run_json(tmp_path, capsys, "--base-url", dummy_server.url,
                             "--api-key", KEY, "--model", "dummy:tiny")
    assert rc == 0, out
    assert "Serving Benchmark Result" in out
    rc, local, _ = run_json(tmp_path, capsys, "--model", "dummy:tiny", "--num-blocks", "128",
                            "--device", "cpu")
    assert rc == 0
    s, ref = http["summary"], local["summary"]
    assert (s["successful_requests"], s["failed_requests"]) == (8, 0)
    # the same token-id prompts, sent as ids: identical lengths request by request
    assert [r["prompt_len"] for r in http["requests"]] == [r["prompt_len"] for r in local["requests"]]
    assert s["total_input_tokens"] == ref["total_input_tokens"]
    assert s["total_output_tokens"] == ref["total_output_tokens"] == 8 * 4
    for r in http["requests"]:       # a chunk per step, or fewer when coalesced under load
        assert 0 < r["ttft"] <= r["e2e"] and r["finish_reason"] == "length"
        assert 1 <= r["chunks"] <= 4 and len(r["itls"]) == r["chunks"] - 1
    assert "api_key" not in http["bench"]              # the key is not written to the JSON


def test_http_bench_repeats_report_median_and_every_run(dummy_server, tmp_path, capsys):
    rc, data, out = run_json(tmp_path, capsys, "--base-url", dummy_server.url, "--api-key", KEY,
                             "--model", "dummy:tiny", "--repeat", "3")
    assert rc == 0, out
    assert out.count("Serving Benchmark Result") == 3 and "median" in out
    runs = [r["summary"]["output_throughput"] for r in data["runs"]]
    assert len(runs) == 3 and all(t > 0 for t in runs)
    assert data["summary"]["successful_requests"] == 8        # the last run in full
    tpots = sorted(r["summary"]["tpot_ms"]["median"] for r in data["runs"])
    assert (f"TPOT p50: median {tpots[1]:.3f} ms ({tpots[0]:.3f}..{tpots[2]:.3f})"
            in " ".join(out.split()))


def test_http_bench_without_the_key_fails_clearly(dummy_server, tmp_path, capsys):
    """The server is asked for its models first: a refused key is one line before any
    request runs (not a report of 8 failed requests)."""
    rc, data, out = run_json(tmp_path, capsys, "--base-url", dummy_server.url,
                             "--model", "dummy:tiny", "--warmup", "0")
    assert rc == 2 and "401" in out and "roseplay bench: error:" in out and data is None


def test_http_bench_chat_needs_text(dummy_server, tmp_path, capsys):
    rc, _, out = run_json(tmp_path, capsys, "--base-url", dummy_server.url, "--api-key", KEY,
                          "--model", "dummy:tiny", "--endpoint", "chat")
    assert rc == 2 and "chat needs text prompts" in out


@pytest.fixture(scope="module")
def bundled_server():
    """The default path: the bundled model in its own engine process, EngineClient."""
    with EngineClient(device="cpu", label="bench-serve", snapshots=False) as engine, \
            ServerThread(build_app(engine)) as srv:
        yield srv


# CI-sized: enough requests at once that admission and streaming overlap the engine's steps
CI_RUN = ["--num-prompts", "16", "--input-len", "32", "--output-len", "8"]
HTTP_FLOOR = 0.25   # of the direct bench's tok/s: 2 shared cores also run client and server


def test_http_bench_keeps_up_with_the_direct_bench_on_the_bundled_model(bundled_server,
                                                                       tmp_path, capsys):
    rc, http, out = run_json(tmp_path, capsys, *CI_RUN, "--base-url", bundled_server.url)
    assert rc == 0, out
    rc, direct, out = run_json(tmp_path, capsys, *CI_RUN, "--device", "cpu")
    assert rc == 0, out
    s, ref = http["summary"], direct["summary"]
    assert (s["successful_requests"], s["failed_requests"]) == (16, 0)
    assert [r["prompt_len"] for r in http["requests"]] == \
        [r["prompt_len"] for r in direct["requests"]]
    assert s["total_output_tokens"] == ref["total_output_tokens"] == 16 * 8
    ratio = s["output_throughput"] / ref["output_throughput"]
    ttft = s["ttft_ms"]["median"] / ref["ttft_ms"]["median"]
    print(f"HTTP/direct on the bundled model: tok/s {s['output_throughput']:.0f} / "
          f"{ref['output_throughput']:.0f} = {ratio:.2f}, TTFT p50 x{ttft:.2f}")
    assert ratio > HTTP_FLOOR, f"HTTP ran {ratio:.2f} of the direct bench's throughput"


def test_http_bench_chat_on_the_bundled_model(bundled_server, tmp_path, capsys):
    rc, data, out = run_json(tmp_path, capsys, "--base-url", bundled_server.url,
                             "--endpoint", "chat")
    assert rc == 0, out
    reqs = data["requests"]
    assert len(reqs) == 8 and all(r["output_len"] == 4 for r in reqs)
    # the server's prompt count includes the chat template's speaker lines
    assert all(r["prompt_len"] > 16 for r in reqs)
