"""An existing router package in front of `roseplay serve` workers: SGLang's router
(`sglang-router`, a test extra in pyproject.toml) routes the official `openai` client's
requests round robin across two workers on the bundled model; it lists their model in its
/v1/models, its greedy completions are a single engine's, both workers serve, and every
process is gone afterwards."""
from __future__ import annotations

import subprocess
import sys
import tempfile
import time

import httpx
import pytest

from tests.roseplay.serve.serve_proc import ServeProc, free_port

pytest.importorskip("sglang_router", reason="the test extra sglang-router is not installed")
openai = pytest.importorskip("openai")

PROMPTS = ["ROMEO:", "JULIET.\nO Romeo,", "First Citizen:\nBefore we proceed", "KING:",
           "HAMLET.\nTo be", "Good morrow,"]
START_TIMEOUT = 120


class RouterProc:
    """`python -m sglang_router.launch_router` on a free 127.0.0.1 port."""

    def __init__(self, workers: list[str]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                     "--port", str(self.port), "--policy", "round_robin", "--log-level", "warn",
                     # its metrics listener: 127.0.0.1 and a free port (its 29000 default
                     # is taken by any other router on the host, and then it exits)
                     "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
                     "--worker-urls", *workers]

    def __enter__(self) -> "RouterProc":
        self._log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            self._come_up()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _come_up(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert self.proc.poll() is None, self.output()
            try:       # up with its workers registered: it answers a completion
                r = httpx.post(self.url + "/v1/completions", timeout=30,
                               json={"model": "default", "prompt": "A", "max_tokens": 1})
                if r.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"the router did not come up\n{self.output()}"
            time.sleep(0.2)

    def output(self) -> str:
        self._log.seek(0)
        return self._log.read()[-3000:]

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def requests_served(url: str) -> float:
    """The worker's finished requests (vllm:request_success_total, every reason)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total"))


def completions(base_url: str) -> list[list[int]]:
    """Each prompt's greedy token ids (roseplay's vLLM extra `return_token_ids`, which the
    router passes through)."""
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0,
                           timeout=120)
    try:
        out = []
        for p in PROMPTS:
            choice = client.completions.create(
                model="default", prompt=p, max_tokens=12, temperature=0,
                extra_body={"return_token_ids": True}).choices[0]
            out.append(choice.model_extra["token_ids"])
        return out
    finally:
        client.close()


@pytest.mark.slow      # three servers on two shared cores: minutes on a loaded CI box
def test_sglang_router_routes_across_roseplay_workers():
    with ServeProc() as a, ServeProc() as b:
        direct = completions(a.url)              # one engine alone: the reference
        before = [requests_served(a.url), requests_served(b.url)]
        with RouterProc([a.url, b.url]) as router:
            # the router learns the workers' model from their /server_info (it listed
            # "unknown", a model no worker serves)
            listed = httpx.get(router.url + "/v1/models", timeout=10).json()["data"]
            assert [m["id"] for m in listed] == ["default"]
            routed = completions(router.url)
            assert router.proc.poll() is None
        served = [requests_served(a.url) - before[0], requests_served(b.url) - before[1]]
        assert routed == direct and all(direct)
        # both served (the router's own readiness probe is one more request somewhere)
        assert min(served) >= 1 and sum(served) >= len(PROMPTS), served
        assert router.proc.returncode is not None
