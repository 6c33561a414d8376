"""LLM(kv_events_config=...) with one replica, as vLLM's LLM: the engine runs in its own
process and publishes its KV events on the given endpoint (keyed by
$ROSEPLAY_ENGINE_KEY), read here with the consumer written from vLLM's schema. It was
refused with "drop --in-process", a flag a Python caller never gave."""
import os

import pytest
import zmq

from engine import LLM, SamplingParams
from engine.config import InvalidRequestError, make_config
from engine.ipc.auth import ENGINE_KEY_ENV
from tests.engine.ipc.test_kv_events import KEY, replay
from tests.engine.vllm_kv_events import CacheMirror, documented_hash
from tests.helpers import engines_owned_by, free_port_block

BS = 4
PROMPT = list(range(1, 9))          # two full blocks


@pytest.fixture(scope="module")
def llm():
    port = free_port_block(2)
    events = {"enable_kv_cache_events": True, "endpoint": f"tcp://127.0.0.1:{port}",
              "replay_endpoint": f"tcp://127.0.0.1:{port + 1}", "topic": "kv"}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENGINE_KEY_ENV, KEY)
        try:
            with LLM(model="dummy:tiny", device="cpu", num_blocks=64, block_size=BS,
                     kv_events_config=events) as llm:
                yield llm, events
        finally:
            assert not engines_owned_by(os.getpid()), "engine process left behind"


def test_one_replica_publishes_its_kv_events_on_the_given_endpoint(llm):
    llm, events = llm
    out = llm.generate([PROMPT], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 2
    first = documented_hash(None, PROMPT[:BS])
    want = {first, documented_hash(first, PROMPT[BS:])}
    mirror, ctx = CacheMirror(), zmq.Context()
    try:
        for _ in range(100):                    # the publisher thread may lag the output
            replay(ctx, events["replay_endpoint"], mirror.next_seq, mirror)
            if want <= mirror.blocks.keys():
                break
    finally:
        ctx.destroy(linger=0)
    assert want <= mirror.blocks.keys()
    assert mirror.blocks[first] == (None, tuple(PROMPT[:BS]))


def test_what_needs_the_engine_in_this_process_says_what_to_do(llm):
    llm, _ = llm
    with pytest.raises(RuntimeError, match=r"or kv_events_config the engines run in their "
                                           r"own processes: use generate\(\)"):
        llm.add_request(PROMPT)
    events = {"enable_kv_cache_events": True}
    with pytest.raises(InvalidRequestError, match="^a proposer needs the engine in this "
                                                  "process, without kv_events_config$"):
        LLM(model="dummy:tiny", device="cpu", proposer=object(), kv_events_config=events)
    with pytest.raises(InvalidRequestError, match=r"^LLM\(config=...\) runs the engine in "
                                                  r"this process, without kv_events_config: "
                                                  r"give the knobs as keywords"):
        LLM(config=make_config(model="dummy:tiny", device="cpu", kv_events_config=events))


def test_an_interrupted_generate_ends_its_requests_in_the_engine_process(llm, monkeypatch):
    """An exception out of generate() (Ctrl-C) ends the requests it sent, as with the
    engine in this process (test_llm_controls.py): they ran on to their end. The engine
    is paused, so they are still queued when the third submit raises."""
    llm, _ = llm
    dp, sent = llm.dp, []
    submit = dp.submit

    def submit_twice(*args, **kwargs):
        if len(sent) == 2:
            raise KeyboardInterrupt
        sent.append(submit(*args, **kwargs))
        return sent[-1]

    long = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
    dp.pause()
    try:
        monkeypatch.setattr(dp, "submit", submit_twice)
        with pytest.raises(KeyboardInterrupt):
            llm.generate([PROMPT] * 3, long)
    finally:
        monkeypatch.undo()
        dp.resume()
    outs = [s.result(60) for s in sent]
    assert [(o.outputs[0].finish_reason, o.outputs[0].token_ids) for o in outs] == \
        [("cancelled", ())] * 2
    assert dp.wait_idle(60)
