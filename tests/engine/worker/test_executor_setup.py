"""engine/worker/executor/setup.py: a start that fails after the tensor-parallel workers
joined stops them (the engine never gets an executor to close), and raises the cause."""
import multiprocessing as mp

import pytest

from engine.config import make_config
from engine.worker.executor import setup
from engine.core.core import LLMEngine


def _tp_workers() -> list:
    return [p for p in mp.active_children() if p.name.startswith("roseplay-tp")]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_failed_start_stops_the_workers_it_started(monkeypatch):
    started = []

    def failing_draft(*args, **kwargs):     # runs once every rank loaded its shard
        started.extend(_tp_workers())
        raise RuntimeError("draft model unreadable")

    monkeypatch.setattr(setup, "build_draft", failing_draft)
    with pytest.raises(RuntimeError, match="draft model unreadable"):
        LLMEngine(make_config(model="dummy:tiny", device="cpu", dtype="float32",
                              tensor_parallel_size=2, num_blocks=16, block_size=4))
    assert len(started) == 1 and started[0].exitcode is not None   # rank 1, joined
    assert _tp_workers() == []


def test_triton_on_the_cpu_is_refused_before_the_model_loads(monkeypatch):
    """attention_backend triton on a CPU without Triton's interpreter: one clear error at
    start (it loaded, then every step failed in Triton with "0 active drivers")."""
    from engine.config import InvalidRequestError

    def no_load(*args, **kwargs):
        raise AssertionError("loaded before the backend was checked")

    monkeypatch.setattr(setup, "INTERPRETED", False)
    monkeypatch.setattr(setup, "load_model", no_load)
    with pytest.raises(InvalidRequestError, match="triton needs a CUDA device"):
        LLMEngine(make_config(model="dummy:tiny", device="cpu", dtype="float32",
                              attention_backend="triton", num_blocks=16, block_size=4))
