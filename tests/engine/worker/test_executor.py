"""engine/worker/executor/: the one object the core runs the model through. The engine
takes the model's facts from it, a step's tokens come back through it, and closing the
engine closes it (at TP=1 too: the runner's CUDA graphs), once or twice."""
import pytest

from benchmarks.oracle import OracleProposer
from engine import LLM, SamplingParams
from engine.config import InvalidRequestError, make_config
from engine.core.core import LLMEngine
from engine.worker.executor import Executor, TPExecutor, UniprocExecutor
from tests.helpers import add_request

KW = dict(model="dummy:tiny", device="cpu", dtype="float32", num_blocks=32, block_size=4)


def test_the_engine_runs_through_its_executor_and_closes_it(monkeypatch):
    eng = LLMEngine(make_config(**KW))
    ex = eng.executor
    assert type(ex) is UniprocExecutor and Executor is UniprocExecutor
    assert not issubclass(UniprocExecutor, TPExecutor) and issubclass(TPExecutor, Executor)
    assert (eng.vocab_size, eng.max_model_len, eng.pool.num_blocks) == \
        (ex.vocab_size, ex.max_model_len, ex.num_blocks)
    kv = ex.runner.kv_cache
    snap = eng.snapshot()
    assert snap.kv_bytes_per_rank == kv.numel() * kv.element_size() and snap.dtype == "float32"
    steps = []
    real = ex.execute_model
    monkeypatch.setattr(ex, "execute_model", lambda batch: steps.append(batch) or real(batch))
    req = add_request(eng, {"prompt_token_ids": [1, 2, 3]},
                      SamplingParams(max_tokens=3, temperature=0, ignore_eos=True), "r")
    while eng.has_unfinished():
        eng.step()
    eng.flush()
    assert len(req.output_token_ids) == 3 and len(steps) >= 3
    assert snap.forward_calls == 0 and eng.snapshot().forward_calls == ex.runner.forward_calls
    closed = []
    monkeypatch.setattr(ex.runner, "close", lambda: closed.append(1))
    eng.close()
    eng.close()                      # idempotent: the executor's close is
    assert closed == [1, 1]


def test_a_proposer_needs_the_engine_in_this_process():
    with pytest.raises(InvalidRequestError, match="a proposer needs the engine in this"):
        LLM(data_parallel_size=2, proposer=OracleProposer(), **KW)
