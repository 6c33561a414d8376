"""`roseplay serve --headless` and a front over running engines (`--engine-address`
given twice or more, docs/ROUTING.md "Replicas on other hosts"): the flags that make no
sense are refused (exit 2); end to end, two headless engines and a front that answers an
OpenAI completion from each, detaches on exit and leaves them serving; an engine without
KV events is refused by name; each headless engine stops cleanly on SIGINT/SIGTERM and
leaves no engine process."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from roseplay.cli import main
from roseplay.serve import cli as serve_cli
from roseplay.serve.cli import build_parser, check_front_flags
from tests.helpers import engines_owned_by, free_port_block
from tests.roseplay.serve.serve_proc import alive, free_port

KEY = "serve-dp-attach-key"
ENGINE = ["--model", "dummy:tiny", "--device", "cpu", "--num-blocks", "256",
          "--block-size", "4"]
EVENTS = ["--kv-events-config", '{"enable_kv_cache_events": true}']
TIMEOUT = 180


@pytest.mark.parametrize("argv, says", [
    (["--headless"], "exactly one --engine-address"),
    (["--headless", "--engine-address", "tcp://127.0.0.1:5000", "--port", "9000"],
     "--port: not with --headless"),
    (["--headless", "--engine-address", "tcp://127.0.0.1:5000", "--routing-policy",
      "cache_aware", "--tui"], "--tui, --routing-policy: not with --headless"),
    # the HTTP server's CORS and X-Request-Id flags (they were taken and ignored)
    (["--headless", "--engine-address", "tcp://127.0.0.1:5000", "--allowed-origins", '["*"]',
      "--enable-request-id-headers"],
     "--allowed-origins, --enable-request-id-headers: not with --headless"),
    (["--engine-address", "tcp://127.0.0.1:5000", "--engine-address", "tcp://127.0.0.1:5010",
      "--data-parallel-size", "3"], "--data-parallel-size 3 conflicts with the 2"),
    (["--engine-address", "tcp://127.0.0.1:5000", "--engine-address", "tcp://127.0.0.1:5010",
      "--api-server-count", "2"], "runs one API server"),
    (["--engine-address", "tcp://127.0.0.1:5000", "--engine-address", "tcp://127.0.0.1:5010",
      "--in-process"], "not with --in-process"),
])
def test_flags_that_make_no_sense_are_exit_2(argv, says, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["serve", *argv])
    assert exc.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.parametrize("argv, says", [
    (["--routing-policy", "cache_aware"], "--routing-policy: routes among engine replicas"),
    (["--data-parallel-size", "1", "--routing-policy", "round_robin",
      "--kv-overlap-score-weight", "2"],
     "--routing-policy, --kv-overlap-score-weight: routes among engine replicas"),
])
def test_the_router_knobs_with_one_engine_are_exit_2(argv, says, capsys, monkeypatch):
    """They were taken and ignored: a server of one engine routes nothing."""
    monkeypatch.setattr(serve_cli, "_engine", lambda args: pytest.fail("an engine started"))
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--model", "dummy:tiny", "--device", "cpu", *argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and says in err.strip().splitlines()[-1], err   # one line


def test_the_router_knobs_go_with_replicas():
    for argv in (["--data-parallel-size", "2"], ["--engine-address", "tcp://127.0.0.1:5000",
                                                 "--engine-address", "tcp://127.0.0.1:5010"]):
        check_front_flags(build_parser().parse_args([*argv, "--routing-policy", "cache_aware",
                                                     "--kv-overlap-score-weight", "2"]))


def test_a_front_refuses_engine_knobs_of_running_engines(capsys):
    code = main(["serve", "--engine-address", "tcp://127.0.0.1:5000", "--engine-address",
                 "tcp://127.0.0.1:5010", "--max-num-seqs", "8"])
    assert code == 2
    assert "max_num_seqs: engine settings of running engines" in capsys.readouterr().err


def test_bench_refuses_the_same_way(capsys):
    assert main(["bench", "--engine-address", "tcp://127.0.0.1:5000", "--engine-address",
                 "tcp://127.0.0.1:5010", "--in-process"]) == 2
    assert "not with --in-process" in " ".join(capsys.readouterr().err.split())   # one line


class Proc:
    """A `roseplay serve` subprocess whose output goes to a file (read as it runs)."""

    def __init__(self, tmp_path, name: str, *args: str):
        self.log = tmp_path / f"{name}.log"
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "roseplay", "serve", *args],
                                         stdout=out, stderr=subprocess.STDOUT,
                                         env={**os.environ, "ROSEPLAY_ENGINE_KEY": KEY})

    def output(self) -> str:
        return self.log.read_text()

    def wait_for(self, text: str) -> None:
        deadline = time.monotonic() + TIMEOUT
        while text not in self.output():
            assert self.proc.poll() is None, self.output()
            assert time.monotonic() < deadline, self.output()
            time.sleep(0.2)

    def stop(self, sig=signal.SIGINT) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def wait_up(url: str, front: Proc) -> None:
    deadline = time.monotonic() + TIMEOUT
    while True:
        assert front.proc.poll() is None, front.output()
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, front.output()
        time.sleep(0.2)


@pytest.mark.slow
def test_headless_engines_behind_a_front_by_address(tmp_path):
    addrs = [f"tcp://127.0.0.1:{free_port_block()}" for _ in range(3)]
    engines = [Proc(tmp_path, f"engine{i}", "--headless", "--engine-address", a, *ENGINE,
                    *(EVENTS if i < 2 else ())) for i, a in enumerate(addrs)]
    try:
        for e in engines:
            e.wait_for("attach a front")
        assert "KV events at" in engines[0].output() and "KV events off" in engines[2].output()
        bad = Proc(tmp_path, "bad", "--engine-address", addrs[0], "--engine-address", addrs[2])
        assert bad.proc.wait(TIMEOUT) == 2
        assert f"the engine at {addrs[2]} publishes no KV events" in bad.output()
        assert "--kv-events-config" in bad.output()
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        front = Proc(tmp_path, "front", "--engine-address", addrs[0], "--engine-address",
                     addrs[1], "--port", str(port), "--log-level", "warning")
        try:
            wait_up(url, front)
            for rank in (0, 1):
                r = httpx.post(url + "/v1/completions", timeout=60, json={
                    "model": "dummy:tiny", "prompt": [1, 2, 3, 4, 5], "max_tokens": 3,
                    "temperature": 0, "return_token_ids": True, "data_parallel_rank": rank})
                assert r.status_code == 200, r.text
                assert len(r.json()["choices"][0]["token_ids"]) == 3
            routing = httpx.get(url + "/routing").json()
            assert [rep["routed"] for rep in routing["replicas"]] == [1, 1]
        finally:
            assert front.stop() == 0, front.output()
        assert "2 engine replicas attached at" in front.output()
        assert all(e.proc.poll() is None for e in engines)      # detached: still serving
    finally:
        codes = [e.stop(sig) for e, sig in zip(engines, (signal.SIGTERM, signal.SIGINT,
                                                         signal.SIGTERM))]
        for e in engines:
            assert not engines_owned_by(e.proc.pid), "engine process left behind"
    assert codes == [0, 0, 0], [e.output() for e in engines]
    assert all("stopping the engine" in e.output() for e in engines)
    assert not any(alive(e.proc.pid) for e in engines)
