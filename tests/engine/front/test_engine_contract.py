"""The EngineAPI contract (engine/front/api.py), one suite run against both transports: the
engine in its own process (EngineClient, the default path) and on a thread of this
process (EngineLoop). Each test runs on each; the cross-transport tests compare them.
One engine of each per module (the last test closes them), and one more of each that
test_a_dead_engine_... kills."""
import gc
import inspect
import os
import signal

import pytest

from engine import InvalidRequestError, SamplingParams, SchedulerConfig
from engine.front.api import EngineAPI, EngineStopped
from engine.front.client import EngineClient
from engine.front.loop import EngineLoop
from engine.outputs import EngineInfo
from tests.helpers import engines_owned_by

ENGINE = dict(model="default", device="cpu", num_blocks=256)
PROMPTS = ["ROMEO:", "JULIET:\nO Romeo", "First Citizen:\nBefore we proceed"]
GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
TIMEOUT = 60
TRANSPORTS = ["client", "loop"]


@pytest.fixture(scope="module")
def client():
    c = EngineClient(label="contract", **ENGINE)
    yield c
    c.close()
    assert not engines_owned_by(os.getpid()), "engine process left behind"


@pytest.fixture(scope="module")
def loop():
    lp = EngineLoop(**ENGINE)
    yield lp
    lp.close()


@pytest.fixture(params=TRANSPORTS)
def api(request) -> EngineAPI:
    return request.getfixturevalue(request.param)


def run(api: EngineAPI, prompt, params=GREEDY, **kw):
    return api.submit(prompt, params, **kw).result(TIMEOUT)


def test_both_implement_the_protocol_with_the_same_info(client, loop):
    assert isinstance(client, EngineAPI) and isinstance(loop, EngineAPI)
    assert type(client.info) is type(loop.info) is EngineInfo
    assert client.info == loop.info
    assert client.info.model_name and client.info.num_blocks == 256
    assert client.knobs == loop.knobs == SchedulerConfig()


@pytest.mark.parametrize("cls", [EngineClient, EngineLoop])
def test_every_call_has_the_protocols_signature(cls):
    """Same parameter names, kinds and defaults (annotations aside) as EngineAPI."""
    def shape(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]
    calls = [n for n, v in vars(EngineAPI).items() if inspect.isfunction(v)
             and not n.startswith("_")]
    assert len(calls) == 14       # (attributes and properties: isinstance, below)
    for name in calls:
        assert shape(getattr(cls, name)) == shape(getattr(EngineAPI, name)), name


def test_greedy_tokens_and_text_equal_across_transports(client, loop):
    outs = {name: [run(api, p) for p in PROMPTS] for name, api in
            (("client", client), ("loop", loop))}
    for a, b in zip(outs["client"], outs["loop"]):
        assert a.error is None and b.error is None
        assert a.outputs[0].finish_reason == b.outputs[0].finish_reason == "length"
        assert len(a.outputs[0].token_ids) == 6
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.outputs[0].text == b.outputs[0].text
        assert a.prompt_token_ids == b.prompt_token_ids


def test_stream_events_add_up_to_the_result(api):
    stream = api.submit(PROMPTS[1], GREEDY)
    events = list(stream)
    assert [e.finished for e in events] == [False] * (len(events) - 1) + [True]
    final = events[-1]
    assert final.finish_reason == "length" and final.error is None
    assert sum((e.token_ids for e in events), ()) == stream.output.outputs[0].token_ids
    assert "".join(e.text for e in events) == stream.output.outputs[0].text
    assert api.wait_idle(TIMEOUT)
    view = api.snapshot().request(stream.request_id)
    assert view is not None and view.state == "finished" and view.finish_reason == "length"
    assert view.output_tokens == 6


def test_stop_string_finishes_with_stop(api, loop):
    ref = run(loop, PROMPTS[0]).outputs[0].text
    word = ref.strip().split()[0][:3]
    out = run(api, PROMPTS[0], SamplingParams(max_tokens=6, temperature=0, stop=[word]))
    assert out.outputs[0].finish_reason == "stop"
    assert word not in out.outputs[0].text and ref.startswith(out.outputs[0].text)


BAD_CALLS = [
    (lambda a: a.submit(PROMPTS[0], SamplingParams(max_tokens=0)), "max_tokens must be"),
    (lambda a: a.submit([10 ** 9]), "token ids must be in [0, "),
    (lambda a: a.submit(""), "prompt is empty"),
    (lambda a: a.submit(PROMPTS[0], {"max_tokens": 3}), "params must be a SamplingParams"),
    (lambda a: a.submit(PROMPTS[0], priority="high"), "priority must be an integer"),
    (lambda a: a.submit(PROMPTS[0], request_id=""), "request_id"),
    (lambda a: a.set_knobs(max_num_seqs=0), "max_num_seqs must be an integer in [1, "),
    (lambda a: a.set_knobs(scheduling_mode="fast"), "scheduling_mode must be one of"),
    (lambda a: a.set_knobs(bogus=1), "unknown knob(s): bogus"),
]


@pytest.mark.parametrize("call,words", BAD_CALLS)
def test_bad_input_raises_the_same_error(api, call, words):
    with pytest.raises(InvalidRequestError) as info:
        call(api)
    assert words in str(info.value)
    assert api.knobs == SchedulerConfig()      # a refused knob changes nothing


def test_bad_input_messages_equal_across_transports(client, loop):
    for call, _ in BAD_CALLS:
        msgs = []
        for api in (client, loop):
            with pytest.raises(InvalidRequestError) as info:
                call(api)
            msgs.append(str(info.value))
        assert msgs[0] == msgs[1]


def test_cancel_ends_with_cancelled_and_no_error(api):
    api.pause()
    stream = api.submit(PROMPTS[0], GREEDY)
    api.cancel(stream.request_id)
    out = stream.result(TIMEOUT)
    assert out.outputs[0].finish_reason == "cancelled" and out.error is None
    assert out.outputs[0].token_ids == ()
    for rid in ("never-submitted", "", None, 5):
        api.cancel(rid)                        # nothing to cancel: no exception
    api.resume()
    assert api.wait_idle(TIMEOUT) and api.snapshot().num_used == 0


def test_a_streams_cancel_is_the_callers_cancel(api):
    """stream.cancel() ends the request as api.cancel does: cancelled, no error (it read
    as a dropped stream's, 'stream dropped by its consumer')."""
    api.pause()
    stream = api.submit(PROMPTS[0], GREEDY)
    stream.cancel()
    out = stream.result(TIMEOUT)
    assert out.outputs[0].finish_reason == "cancelled" and out.error is None
    api.resume()
    assert api.wait_idle(TIMEOUT)


def test_a_dropped_stream_is_cancelled(api):
    api.pause()
    api.submit(PROMPTS[0], GREEDY, request_id="dropped")
    gc.collect()
    api.resume()
    assert api.wait_idle(TIMEOUT)
    view = api.snapshot().request("dropped")
    assert view.state == "cancelled" and view.error == "stream dropped by its consumer"


def test_duplicate_live_id_raises_and_leaves_the_first_intact(api):
    api.pause()
    first = api.submit(PROMPTS[0], GREEDY, request_id="dup")
    with pytest.raises(InvalidRequestError, match="duplicate request id 'dup'"):
        api.submit(PROMPTS[1], GREEDY, request_id="dup")
    gc.collect()                               # the refused stream cancels nothing
    api.resume()
    out = first.result(TIMEOUT)
    assert out.outputs[0].finish_reason == "length" and len(out.outputs[0].token_ids) == 6
    again = run(api, PROMPTS[0], request_id="dup")    # ended: the id is free again
    assert again.outputs[0].token_ids == out.outputs[0].token_ids


def test_knobs_round_trip(api):
    try:
        knobs = api.set_knobs(max_num_seqs=7, scheduling_policy="lpm")
        assert knobs == SchedulerConfig(max_num_seqs=7, scheduling_policy="lpm")
        assert api.knobs == knobs
        assert api.wait_idle(TIMEOUT) and api.snapshot().knobs == knobs
        assert api.set_knobs(eviction_policy="lfu").max_num_seqs == 7   # changes only
        assert api.wait_idle(TIMEOUT) and api.snapshot().knobs.eviction_policy == "lfu"
    finally:
        api.set_knobs(**{f: getattr(SchedulerConfig(), f) for f in
                         ("max_num_seqs", "scheduling_policy", "eviction_policy")})
    assert api.wait_idle(TIMEOUT) and api.snapshot().knobs == SchedulerConfig()


def test_pause_and_step_once_run_one_step_at_a_time(api, loop):
    want = run(loop, PROMPTS[2], SamplingParams(max_tokens=3, temperature=0,
                                                ignore_eos=True)).outputs[0].token_ids
    api.pause()
    assert api.paused
    stream = api.submit(PROMPTS[2], SamplingParams(max_tokens=3, temperature=0,
                                                   ignore_eos=True))
    assert api.wait_idle(TIMEOUT)              # paused: idle with the request waiting
    snap = api.snapshot()
    assert snap.paused and snap.request(stream.request_id).state == "waiting"
    for n in (1, 2):
        assert api.step_once().wait(TIMEOUT)
        assert api.wait_idle(TIMEOUT)
        view = api.snapshot().request(stream.request_id)
        assert view.output_tokens == n and view.output_tail == want[:n]
    api.resume()
    assert not api.paused
    assert stream.result(TIMEOUT).outputs[0].token_ids == want


def test_reset_prefix_cache_forgets_every_cached_block(api):
    """vLLM's reset_prefix_cache, one command through either transport: blocks a finished
    request left cached become free."""
    api.watch(False)
    try:
        run(api, PROMPTS[2] * 4)
        assert api.wait_idle(TIMEOUT) and api.snapshot().num_cached > 0
        api.reset_prefix_cache()
        assert api.wait_idle(TIMEOUT)
        snap = api.snapshot()
        assert snap.num_cached == 0 and snap.num_free == api.info.num_blocks
    finally:
        api.watch(True)


def test_snapshot_describes_the_engine(api):
    run(api, PROMPTS[0])        # its own finished request: the test holds run alone too
    api.reset_prefix_cache()
    api.watch(False)
    try:
        assert api.wait_idle(TIMEOUT)
        snap, info = api.snapshot(), api.info
        assert (snap.model, snap.num_blocks, snap.block_size, snap.device, snap.dtype) == (
            info.model_name, info.num_blocks, info.block_size, info.device, info.dtype)
        assert snap.block_state.shape == snap.block_refcount.shape == (info.num_blocks,)
        assert snap.num_free == info.num_blocks and snap.num_used == snap.num_cached == 0
        assert snap.counters.finished > 0 and snap.step > 0 and not snap.paused
        assert snap.backend == info.backend and snap.max_model_len == info.max_model_len
        assert snap.tensor_parallel_size == 1 and snap.kv_bytes_per_rank > 0
        assert snap.peak_used_blocks > 0 and snap.forward_calls > 0
        api.reset_peak_usage()
        assert api.wait_idle(TIMEOUT) and api.snapshot().peak_used_blocks == 0
        stats = api.engine_stats()
        assert stats.num_running == stats.num_waiting == 0
    finally:
        api.watch(True)


def _kill_loop(loop: EngineLoop) -> str:
    def schedule():
        raise KeyError("scheduler state corrupted")
    loop.engine.scheduler.schedule = schedule
    loop.step_once()
    return "scheduler state corrupted"


def _kill_client(client: EngineClient) -> str:
    os.kill(client.proc.pid, signal.SIGKILL)
    return "engine process died"


@pytest.mark.parametrize("make,kill", [(EngineClient, _kill_client), (EngineLoop, _kill_loop)],
                         ids=TRANSPORTS)
def test_a_dead_engine_ends_every_request_with_its_error(make, kill):
    api = make(**ENGINE)
    try:
        api.pause()
        streams = [api.submit(p, GREEDY) for p in PROMPTS]
        words = kill(api)
        for s in streams:
            out = s.result(TIMEOUT)
            assert out.outputs[0].finish_reason == "error" and words in out.error
        assert words in api.fatal_error and out.error == api.fatal_error
        assert not api.wait_idle(TIMEOUT)
        with pytest.raises(EngineStopped, match=f"engine is stopped.*{words}"):
            api.submit(PROMPTS[0], GREEDY)
    finally:
        api.close()
        api.close()


def test_close_is_idempotent_and_cancels_live_requests(api):
    """Last: closes the module's engines."""
    api.pause()
    stream = api.submit(PROMPTS[0], GREEDY)
    api.close()
    api.close()
    out = stream.result(TIMEOUT)
    assert (out.outputs[0].finish_reason, out.error) == ("cancelled", "engine closed")
    with pytest.raises(EngineStopped, match="engine is stopped"):
        api.submit(PROMPTS[0], GREEDY)
    api.cancel(stream.request_id)              # every other call: harmless after close
    api.pause()
    api.resume()
    api.reset_prefix_cache()
    api.reset_peak_usage()
    api.watch(False)
    assert api.set_knobs(max_num_seqs=3).max_num_seqs == 3     # still validated
    assert api.step_once().wait(1)             # nothing will run it: never blocks
    assert api.wait_idle(1)
