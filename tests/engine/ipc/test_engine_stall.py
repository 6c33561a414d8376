"""A stop (SIGSTOP) of the engine process, judged by one policy on every kind of client:
the owner and an attached client (as `roseplay --connect` and the API servers of `serve
--api-server-count` are) alike. Shorter than client_timeout, it ends nothing: every
stream gets the tokens of an unstopped run. Longer, every client judges the engine gone
and ends its open requests with an error naming client_timeout. Before, an attached
client gave up after a fixed 10 s whatever client_timeout said, and the owner never did.
A client stopped for less than client_timeout loses no output either (before, zmq
dropped what went past its high-water mark toward the stopped client). The server's
side: tests/roseplay/serve/test_serve_liveness.py."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from engine import SamplingParams
from engine.front.client import EngineClient

pytestmark = pytest.mark.timeout(180)
TIMEOUT = 60
PROMPTS = ["ROMEO:", "JULIET:\nO Romeo", "First Citizen:\nBefore we proceed"]
PARAMS = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
OLD_FIXED_LIMIT = 10.0     # what an attached client tolerated before


def stopped(pid: int, seconds: float) -> None:
    """The engine process stopped for `seconds` (the stall under test)."""
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)


def test_an_engine_stall_shorter_than_client_timeout_ends_no_stream():
    with EngineClient(model="default", device="cpu", num_blocks=256, label="owner",
                      client_timeout=OLD_FIXED_LIMIT + 4) as owner, \
            EngineClient(connect=owner.address, label="attached") as attached:
        clients = (owner, attached)
        unstopped = [c.submit(p, PARAMS) for c in clients for p in PROMPTS]
        reference = [list(s.result(TIMEOUT).outputs[0].token_ids) for s in unstopped]
        streams = [c.submit(p, PARAMS) for c in clients for p in PROMPTS]
        for s in streams:
            s.get(timeout=TIMEOUT)                   # every one is generating
        stopped(owner.proc.pid, OLD_FIXED_LIMIT + 1.5)
        outs = [s.result(TIMEOUT) for s in streams]
        assert owner.fatal_error is None and attached.fatal_error is None
    for ref, out in zip(reference, outs):
        assert (out.error, out.outputs[0].finish_reason) == (None, "length")
        assert list(out.outputs[0].token_ids) == ref


@pytest.mark.slow        # the long tier (README)
def test_an_engine_stall_past_client_timeout_ends_every_clients_streams_with_an_error():
    with EngineClient(model="default", device="cpu", num_blocks=256, label="owner",
                      client_timeout=3) as owner, \
            EngineClient(connect=owner.address, label="attached") as attached:
        streams = [c.submit(PROMPTS[0], SamplingParams(max_tokens=900, temperature=0,
                                                        ignore_eos=True))
                   for c in (owner, attached)]
        for s in streams:
            s.get(timeout=TIMEOUT)
        os.kill(owner.proc.pid, signal.SIGSTOP)
        try:
            outs = [s.result(TIMEOUT) for s in streams]   # while the engine is stopped
        finally:
            os.kill(owner.proc.pid, signal.SIGCONT)
        errors = (owner.fatal_error, attached.fatal_error)
    for out in outs:
        assert out.outputs[0].finish_reason == "error"
        assert "sent nothing for 3 s (client_timeout)" in out.error, out.error
    assert all(e and "client_timeout" in e for e in errors), errors


STALLED_CLIENT = """
import sys
from engine import SamplingParams
from engine.front.client import EngineClient
c = EngineClient(connect=sys.argv[1], label="stalled", snapshots=False)
sp = SamplingParams(max_tokens=int(sys.argv[2]), temperature=0, ignore_eos=True, logprobs=20)
streams = [c.submit({"prompt_token_ids": [1 + i, 2, 3]}, sp) for i in range(int(sys.argv[3]))]
streams[0].get(60)
print("STREAMING", flush=True)
for s in streams:
    out = s.result(120)
    print(out.outputs[0].finish_reason, out.error, len(out.outputs[0].token_ids), flush=True)
c.close()
"""
MANY_STEPS, REQUESTS = 1500, 2       # messages far past zmq's default high-water mark (1000)


@pytest.mark.slow        # the long tier (README)
def test_a_client_stopped_within_client_timeout_loses_no_output():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    with EngineClient(model="dummy:tiny", device="cpu", num_blocks=2048, label="owner",
                      client_timeout=60, snapshots=False) as owner:
        proc = subprocess.Popen([sys.executable, "-c", STALLED_CLIENT, owner.address,
                                 str(MANY_STEPS), str(REQUESTS)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=root)
        try:
            assert proc.stdout.readline().strip() == "STREAMING"
            os.kill(proc.pid, signal.SIGSTOP)
            try:        # every output of its requests is sent while it is stopped
                assert owner.wait_idle(120)
            finally:
                os.kill(proc.pid, signal.SIGCONT)
            out, err = proc.communicate(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    # a lost message would lose a step's tokens, or a request's end (it would hang)
    assert [line.split() for line in out.splitlines()] == \
        [["length", "None", str(MANY_STEPS)]] * REQUESTS, (out, err[-2000:])
