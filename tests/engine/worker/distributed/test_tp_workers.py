"""The worker processes of tensor parallel: a rank that dies ends the group with an error
naming it (no hang), a rank that cannot load reports why, and nothing outlives the engine
(clean shutdown, and a SIGKILLed engine process)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from engine.config import InvalidRequestError
from engine.worker.distributed.worker import TPWorkerError, TPWorkerGroup, WorkerSpec
from engine.worker.models.loader import load_model
from kernels import get_ops
from engine.worker.runner import ModelRunner
from tests.engine.worker.distributed.tp_helpers import BLOCK_SIZE, NUM_BLOCKS, RUNNER_KW, PagedDriver

pytestmark = pytest.mark.slow       # the long tier: `pytest --run-slow` (README)

CPU, F32 = torch.device("cpu"), torch.float32
# "no hang", not a speed: a rank 0 that missed a dead peer waits out the collectives'
# timeout (WorkerSpec.timeout_s, 600 s); a loaded 2-core host takes seconds to notice
HANG_S = 60.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:     # a zombie is gone for our purposes
        return f.read().split()[2] != "Z"


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def group():
    g = TPWorkerGroup(WorkerSpec("dummy:tiny", 2))
    tp = g.start()
    model = load_model("dummy:tiny", CPU, F32, tp=tp).model
    g.wait_ready()
    g.allocate_kv(NUM_BLOCKS, BLOCK_SIZE, **RUNNER_KW)
    g.runner = ModelRunner(model, get_ops("torch"), CPU, F32, NUM_BLOCKS, BLOCK_SIZE, **RUNNER_KW)
    yield g
    g.shutdown()


def _step(g):
    step, _ = PagedDriver([[1, 2, 3, 4, 5], [6, 7]]).build([], [(0, 0, 5), (1, 0, 2)])
    return g.run(step, g.runner.execute)


@pytest.mark.parametrize("when", ["idle", "in_step"])
def test_killed_worker_ends_the_group_with_a_clear_error(group, when):
    assert _step(group).shape == (2, 512)
    pid = group.procs[0].pid
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    if when == "in_step":   # rank 0 inside a collective whose peer is gone
        step, _ = PagedDriver([[1, 2, 3]] * 2).build([], [(0, 0, 3)])
        with pytest.raises(RuntimeError, match="Connection reset by peer"):
            group.runner.execute(step)     # what a bare collective says
        with pytest.raises(TPWorkerError, match=rf"rank 1 \(pid {pid}\) exited with code -9"):
            group.check(wait_s=3.0)        # and what the group makes of it
    with pytest.raises(TPWorkerError, match=rf"rank 1 \(pid {pid}\) exited with code -9.*"
                                            r"cannot continue"):
        while time.monotonic() - t0 < HANG_S:    # the watchdog notices within ~0.1 s
            _step(group)
            time.sleep(0.05)
    with pytest.raises(TPWorkerError):   # every later call: the same error
        group.broadcast(None)
    group.shutdown()
    assert not _alive(pid)


def test_clean_shutdown_leaves_no_process(group):
    _step(group)
    pids = [p.pid for p in group.procs]
    group.shutdown()
    assert [p.exitcode for p in group.procs] == [0]
    assert not any(_alive(pid) for pid in pids)
    group.shutdown()   # idempotent


def test_worker_that_cannot_load_reports_why(tmp_path):
    """Rank 1 finds a broken checkpoint rank 0 never read: wait_ready names rank and cause."""
    from tests.hf_models import make_checkpoint
    make_checkpoint("llama", tmp_path)
    g = TPWorkerGroup(WorkerSpec(str(tmp_path), 2))
    g.start()
    (tmp_path / "model.safetensors").write_bytes(b"garbage")   # after rank 0's config read
    with pytest.raises(TPWorkerError, match=r"rank 1 .*unreadable weights"):
        g.wait_ready()
    assert not any(p.is_alive() for p in g.procs)


def test_indivisible_heads_are_refused_before_any_worker_starts():
    g = TPWorkerGroup(WorkerSpec("dummy:tiny", 3))
    with pytest.raises(InvalidRequestError, match=r"does not divide the attention heads \(4\)"):
        g.start()
    assert g.procs == []


ENGINE = textwrap.dedent("""
    import sys, time, torch
    from engine.worker.distributed.worker import TPWorkerGroup, WorkerSpec
    from engine.worker.models.loader import load_model
    g = TPWorkerGroup(WorkerSpec("dummy:tiny", 2, transport=sys.argv[1]))
    tp = g.start()
    load_model("dummy:tiny", torch.device("cpu"), torch.float32, tp=tp)
    g.wait_ready()
    print(g.procs[0].pid, flush=True)
    time.sleep(60)
""")


@pytest.mark.parametrize("transport", ["shm", "torch"])
def test_killed_engine_leaves_no_orphan_worker(transport):
    proc = subprocess.Popen([sys.executable, "-c", ENGINE, transport], stdout=subprocess.PIPE,
                            text=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))))
    try:
        worker = int(proc.stdout.readline())
        assert _alive(worker)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert _wait_gone(worker, HANG_S), f"worker {worker} outlived its engine"
    finally:
        proc.kill()
        proc.wait()


class _KilledAtBirth(TPWorkerGroup):
    """Kills rank 1 as soon as it is spawned (it is still importing torch)."""

    def _await(self, expected):
        if expected == "joining":
            os.kill(self.procs[0].pid, signal.SIGKILL)
        return super()._await(expected)


def test_worker_dead_before_the_rendezvous_does_not_hang_rank0():
    g = _KilledAtBirth(WorkerSpec("dummy:tiny", 2))
    t0 = time.monotonic()
    with pytest.raises(TPWorkerError, match=r"rank 1 .*(exited|failed to start)"):
        g.start()
    assert time.monotonic() - t0 < HANG_S
    assert not g.procs[0].is_alive()


def test_more_ranks_than_gpus_are_refused():
    g = TPWorkerGroup(WorkerSpec("dummy:tiny", 2, device_type="cuda"))
    if torch.cuda.device_count() >= 2:
        pytest.skip("this host has 2 GPUs")
    with pytest.raises(InvalidRequestError, match=r"tensor_parallel_size 2 needs 2 GPUs, \d "
                                                  r"visible"):
        g.start()
    assert g.procs == []
