"""Property-based fuzzing (hypothesis, fixed seed, bounded examples) of the remote
boundaries: the engine-process protocol (random bytes, random msgpack, every message type
with wrong-typed or odd fields, sent to a live core process from a raw socket) and the
HTTP bodies of /v1/completions and /v1/chat/completions (the app in-process). After each
case the engine still serves a known greedy request with the same tokens and no block
leaked (tests/engine/fuzz_values.py)."""
from __future__ import annotations

import json

import msgspec
import pytest
import zmq
from hypothesis import given
from hypothesis import strategies as st

from engine.ipc.attach import open_socket
from engine.front.client import EngineClient
from engine.ipc import auth
from engine.ipc import protocol as P
from engine import commands as C
from tests.engine import fuzz_values as F
from tests.engine.fuzz_values import ENGINE, VOCAB

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.usefixtures("print_counts")]   # tests/engine/conftest.py


# -- engine-process protocol ---------------------------------------------------------------
@pytest.fixture(scope="module")
def core():
    c = EngineClient(label="victim", **ENGINE)
    yield c
    c.close()


@pytest.fixture(scope="module")
def core_reference(core):
    out = core.submit(F.REF_PROMPT, F.REF_PARAMS).result(timeout=60)
    return list(out.outputs[0].token_ids)


@pytest.fixture(scope="module")
def stranger(core):
    """A raw DEALER on the core's command socket: a peer that is not our client, but holds
    the engine key (past the CURVE handshake with it: without, nothing it sends even
    reaches the engine's code, tests/engine/ipc/test_unauthenticated_peers.py)."""
    ctx = zmq.Context()
    sock = open_socket(ctx, zmq.DEALER, P.endpoints(core.address)[0],
                       auth.read_key(core.address), b"stranger")
    sock.send(hello(core))
    yield sock
    sock.close()
    ctx.term()


def hello(core) -> bytes:
    return P.encoder.encode(P.Hello("stranger"))


TAGS = [cls.__name__ for cls in P.ClientMessage.__args__]
PLAUSIBLE_FIELDS = {
    "request_id": st.text(max_size=300), "prompt_token_ids": F.token_ids(VOCAB),
    "params": st.fixed_dictionaries({}, optional={
        k: v for k, v in F.SAMPLING_FIELDS.items() if k != "stop"}).map(
        lambda d: {k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items()}),
    "arrival_time": st.floats(), "prompt_preview": st.one_of(st.none(), st.text(max_size=100)),
    "reason": st.sampled_from(["cancelled", "stop", "length", "error", "", "zzz"]),
    "error": st.one_of(st.none(), st.text(max_size=20)), "knobs": F.JSON, "paused": st.booleans(),
    "token": st.integers(-(2 ** 63), 2 ** 64 - 1), "client": st.text(max_size=20),
}


@st.composite
def tagged_message(draw) -> dict:
    """A message of one of the protocol's types with fields plausible, wrong-typed or
    missing, and sometimes extra."""
    msg = {"type": draw(st.sampled_from(TAGS + ["Nope", ""]))}
    for name, plausible in PLAUSIBLE_FIELDS.items():
        if draw(st.integers(0, 2)) == 0:
            msg[name] = draw(st.one_of(plausible, plausible, F.JSON))
    return msg


def _msgpack(value) -> bytes:
    try:
        return msgspec.msgpack.encode(value)
    except (OverflowError, TypeError):
        return b"\xc1"        # msgpack's never-used byte


FRAMES = st.one_of(
    st.binary(max_size=64).map(lambda b: [b]),
    F.JSON.map(lambda v: [_msgpack(v)]),
    tagged_message().map(lambda m: [_msgpack(m)]),
    tagged_message().map(lambda m: [_msgpack(m)]),
    st.lists(st.binary(max_size=8), min_size=2, max_size=3))      # a frame count we never send


@F.fuzz_settings(80)
@given(st.lists(FRAMES, min_size=1, max_size=4))
def test_protocol_garbage_never_stops_the_core(core, core_reference, stranger, messages):
    stranger.send(hello(core))         # a fuzzed Bye of the last example logged it out
    for frames in messages:
        F.TRIED["engine-process protocol"] += 1
        stranger.send_multipart(frames)
    # pausing is a shared control (the TUI pauses a bench's engine): the stranger's last
    # word resumes it (one socket's messages are handled in order)
    stranger.send(hello(core))
    stranger.send(P.encoder.encode(C.SetPaused(False)))
    F.still_serves(core, core_reference)


def test_a_stranger_cannot_cancel_or_stop_anothers_requests(core, core_reference, stranger):
    """Abort of someone else's request id and Shutdown from a client that does not own
    the engine are ignored (any client could otherwise take the service down)."""
    from engine import SamplingParams
    sp = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    stream = core.submit(F.REF_PROMPT, sp, request_id="mine")
    stream.get(timeout=30)
    stranger.send(P.encoder.encode(C.Abort("mine")))
    stranger.send(P.encoder.encode(P.Shutdown()))
    out = stream.result(timeout=60)
    assert out.error is None and out.outputs[0].finish_reason == "length"
    assert len(out.outputs[0].token_ids) == 40
    F.still_serves(core, core_reference)


# -- HTTP ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def http():
    from fastapi.testclient import TestClient

    from engine.front.loop import EngineLoop
    from roseplay.serve.app import build_app
    loop = EngineLoop(device="cpu", num_blocks=64, max_model_len=64)   # bounded outputs
    with TestClient(build_app(loop)) as client:
        yield loop, client
    loop.close()


@pytest.fixture(scope="module")
def http_reference(http):
    loop, _ = http
    return list(loop.submit(F.REF_PROMPT, F.REF_PARAMS).result(timeout=60).outputs[0].token_ids)


VALID_FIELDS = {
    "max_tokens": st.integers(1, 6), "n": st.integers(1, 2), "temperature": st.floats(0, 2),
    "top_p": st.floats(0.05, 1), "top_k": st.integers(-1, 50), "seed": st.integers(0, 2 ** 63),
    "stop": st.one_of(st.text(min_size=1, max_size=4), st.lists(st.text(min_size=1, max_size=4),
                                                                 max_size=2)),
    "stream": st.booleans(), "ignore_eos": st.booleans(), "return_token_ids": st.booleans(),
}
ODD_FIELDS = {
    "max_tokens": st.one_of(st.integers(-1, 100), st.just(10 ** 9)),
    "n": st.one_of(st.integers(-1, 4), st.sampled_from([129, 10 ** 6])), "temperature": st.floats(),
    "top_p": st.floats(), "top_k": st.integers(), "seed": st.integers(),
    "stop_token_ids": st.lists(st.integers(-1, 70000), max_size=3),
    "stream_options": st.fixed_dictionaries({"include_usage": F.JSON}), "logit_bias": F.JSON,
    "presence_penalty": F.JSON, "user": F.JSON, "logprobs": F.JSON, "echo": F.JSON,
    "best_of": F.JSON, "suffix": F.JSON, "max_completion_tokens": F.JSON, "tools": F.JSON,
    "add_generation_prompt": F.JSON, "response_format": F.JSON, "model": F.JSON,
}
COMPLETION_PROMPTS = st.one_of(st.text(min_size=1, max_size=30), F.token_ids(70000, 20),
                               st.lists(st.text(min_size=1, max_size=10), min_size=1, max_size=3),
                               st.lists(F.token_ids(300, 8), max_size=3))
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]),
                                 "content": st.text(max_size=30)})
ODD_MESSAGE = st.fixed_dictionaries(
    {"role": st.one_of(st.sampled_from(["tool", "ROMEO", "developer"]), F.JSON),
     "content": st.one_of(st.lists(st.fixed_dictionaries(
         {"type": st.sampled_from(["text", "image_url"]), "text": st.text(max_size=10)}), max_size=2),
         F.JSON)})
ODD_FIELDS["messages"] = st.one_of(st.lists(st.one_of(MESSAGE, ODD_MESSAGE), max_size=3), F.JSON)
ODD_FIELDS["prompt"] = st.one_of(st.lists(st.text(max_size=10), max_size=3), F.JSON)


@st.composite
def body(draw, chat: bool) -> dict:
    """A mostly valid request with at most one field made odd (wrong type, out of range,
    unsupported), so that each odd value is seen on its own."""
    out = {"model": "default"}
    if chat:
        out["messages"] = draw(st.lists(MESSAGE, min_size=1, max_size=2))
    else:
        out["prompt"] = draw(COMPLETION_PROMPTS)
    out.update(draw(st.fixed_dictionaries({}, optional=VALID_FIELDS)))
    for name in draw(st.lists(st.sampled_from(sorted(ODD_FIELDS)), max_size=1)):
        out[name] = draw(st.one_of(ODD_FIELDS[name], F.JSON))
    return out


BODY = st.one_of(
    st.tuples(st.just("/v1/completions"), body(chat=False).map(json.dumps)),
    st.tuples(st.just("/v1/chat/completions"), body(chat=True).map(json.dumps)),
    st.tuples(st.sampled_from(["/v1/completions", "/v1/chat/completions"]),
              st.one_of(F.JSON.map(json.dumps), st.binary(max_size=40))))


@F.fuzz_settings(100)
@given(BODY)
def test_http_bodies_get_an_answer_never_a_500(http, http_reference, case):
    """Every body gets 200 or an OpenAI-format 4xx; a 200 carries the choices asked for."""
    loop, client = http
    path, body = case
    F.TRIED[f"HTTP {path}"] += 1
    r = client.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code in (200, 400, 404, 413, 422), (r.status_code, r.text[:500])
    if r.status_code != 200:
        F.REFUSED[f"HTTP {path}"] += 1
        err = r.json()["error"]
        assert err["message"] and set(err) == {"message", "type", "param", "code"}
    elif r.headers["content-type"].startswith("text/event-stream"):
        assert r.text.rstrip().endswith("data: [DONE]"), r.text[-300:]
    else:
        assert r.json()["choices"], r.text[:300]
    F.still_serves(loop, http_reference)
