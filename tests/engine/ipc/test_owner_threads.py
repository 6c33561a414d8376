"""An engine process's life follows its owner process, not the owner's threads or its
manners: one started from a short-lived thread keeps serving after the thread returns
(PR_SET_PDEATHSIG fires when the forking *thread* ends: engine/ipc/launch.py spawn), and
an owner that exits without closing its front (a DPClient of two replicas, requests in
flight, streams held) exits at once and leaves no engine process behind."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from engine.front.client import EngineClient
from engine.ipc.core_proc import SIGTERM_GRACE_S
from engine.request import SamplingParams
from tests.helpers import engines_owned_by

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
KW = dict(model="dummy:tiny", device="cpu", num_blocks=64, block_size=4)


def test_an_engine_started_from_a_thread_outlives_the_thread():
    """The thread that built the client returns; the engine serves on past the time a
    SIGTERM then would have stopped it (it did: `the engine process got SIGTERM`)."""
    made = []
    t = threading.Thread(target=lambda: made.append(EngineClient(**KW)))
    t.start()
    t.join()
    with made[0] as client:
        until = time.monotonic() + SIGTERM_GRACE_S + 2.0
        served = 0
        while time.monotonic() < until or served < 3:
            out = client.submit([1, 2, 3], SamplingParams(max_tokens=2, temperature=0)).result(60)
            assert out.error is None, out.error
            served += 1
        assert client.proc.poll() is None and client.fatal_error is None


NEVER_CLOSED = textwrap.dedent("""
    import os, signal, sys
    from engine.front.dp_client import DPClient
    from engine.request import SamplingParams
    dp = DPClient(data_parallel_size=2, model="dummy:tiny", device="cpu", num_blocks=256,
                  block_size=4)
    long = SamplingParams(max_tokens=900, temperature=0, ignore_eos=True)
    held = [dp.submit([1, 2, 3], long, data_parallel_rank=r % 2) for r in range(4)]
    held[0].get(60), held[1].get(60)               # both replicas are generating
    dp.watch(True)
    print(*(c.proc.pid for c in dp.replicas), flush=True)
    if sys.argv[1:] == ["stop"]:                    # replica 1 stopped (SIGSTOP) as well
        os.kill(dp.replicas[1].proc.pid, signal.SIGSTOP)
    # exits with the front open: no close(), streams held, replicas mid-generation
""")


@pytest.mark.parametrize("replica_1", ["running", "stop"])
def test_an_owner_that_never_closes_its_front_exits_at_once_and_leaves_no_engine(replica_1):
    """Its engines hold copies of its stdout: the pipe closes only once they are gone
    too, so communicate() returning is the engines' exit as well as the owner's. A
    replica stopped with SIGSTOP held its owner's death signal until continued: it
    outlived the owner (stopped for good), and the pipe never closed."""
    proc = subprocess.Popen([sys.executable, "-c", NEVER_CLOSED, replica_1], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": ROOT})
    try:
        out, err = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        for pid in engines_owned_by(proc.pid):     # what holds the pipe
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.communicate()
        raise
    assert proc.returncode == 0, err[-2000:]
    pids = [int(p) for p in out.split()]
    assert len(pids) == 2
    assert not engines_owned_by(proc.pid)
