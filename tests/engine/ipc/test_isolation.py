"""Isolation on the default path (the engine in its own process): one client's bad
request fails only itself. Poison requests mixed into good ones with the same prompt are
refused with the field named, at the client (SamplingParams) or at the core's boundary
(a raw Submit from a key holder); every good request gets the tokens of its solo run. A
submit that fails leaves no state and its id can be used again; cancel() of any value
is safe. (Followers of a failed dedup leader: tests/engine/core/test_faults.py.)"""
import threading

import pytest
import zmq

from engine import InvalidRequestError, SamplingParams
from engine.ipc.attach import open_socket
from engine.front.client import EngineClient
from engine.ipc import auth
from engine.ipc import protocol as P
from engine.outputs import CoreRequest, FinishedRequest, StepOutput

PROMPT = "ROMEO:\nWhat light through yonder window breaks?"
GOOD = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
TIMEOUT = 60


@pytest.fixture(scope="module")
def client():
    c = EngineClient(model="default", device="cpu", num_blocks=256, label="iso")
    yield c
    c.close()


@pytest.fixture(scope="module")
def solo(client):
    return list(client.submit(PROMPT, GOOD).result(TIMEOUT).outputs[0].token_ids)


def raw_submit(address: str, request_id: str, params: dict, prompt_ids: list[int]) -> FinishedRequest:
    """A Submit as another program would send it (with the key): the core must refuse
    it by itself, with the field named."""
    ctx = zmq.Context()
    ident = f"raw-{request_id}".encode()
    socks = []
    try:
        for ep in P.endpoints(address)[:2]:
            socks.append(open_socket(ctx, zmq.DEALER, ep, auth.read_key(address), ident))
        send, recv = socks
        while True:                         # Hello until Welcome (the out route may lag)
            send.send(P.encoder.encode(P.Hello("raw")))
            if recv.poll(500) and isinstance(P.core_decoder.decode(recv.recv()), P.Welcome):
                break
        send.send(P.encoder.encode(CoreRequest(request_id, prompt_ids, params, 0.0)))
        while recv.poll(TIMEOUT * 1000):
            msg = P.core_decoder.decode(recv.recv())
            if isinstance(msg, StepOutput) and msg.finished:
                return msg.finished[0]
        raise AssertionError("no answer to the raw Submit")
    finally:
        for s in socks:
            s.close(0)
        ctx.term()


POISON_PARAMS = [  # (SamplingParams kwargs, words of the refusal)
    (dict(temperature=1, top_k=2 ** 63), "top_k must be an integer in [-1, 2147483647]"),
    (dict(max_tokens=10 ** 30), "max_tokens must be an integer in [1, 2147483647]"),
    (dict(stop_token_ids=[2 ** 64]), "stop_token_ids entry must be an integer in [0, 2147483647]"),
    (dict(stop=["\ud800"]), "stop is not valid Unicode"),
]


def test_poison_requests_fail_alone_and_good_ones_match_their_solo_run(client, solo):
    results, errors = {}, []

    def good(i):
        results[i] = client.submit(PROMPT, GOOD, request_id=f"good-{i}").result(TIMEOUT)

    def poison(kwargs, words):
        try:
            SamplingParams(**kwargs)
        except InvalidRequestError as exc:
            errors.append((words, str(exc)))
    threads = [threading.Thread(target=good, args=(i,)) for i in range(16)]
    threads[8:8] = [threading.Thread(target=poison, args=p) for p in POISON_PARAMS]
    for t in threads:
        t.start()
    # the same poison past the client, straight to the core, while the good ones run
    ids = client.inputs.process(PROMPT)[0].prompt_token_ids
    raw = [raw_submit(client.address, f"raw-{n}", params, list(ids)) for n, params in
           enumerate([{"temperature": 1, "top_k": 2 ** 63}, {"max_tokens": 2 ** 63},
                      {"stop_token_ids": [2 ** 63]}, {"seed": 1.5},
                      {"top_k": "x"}])]
    for t in threads:
        t.join(TIMEOUT)
    assert sorted(results) == list(range(16))
    for out in results.values():
        assert out.error is None and out.outputs[0].finish_reason == "length"
        assert list(out.outputs[0].token_ids) == solo
    assert len(errors) == 4 and all(words in msg for words, msg in errors), errors
    assert [f.finish_reason for f in raw] == ["error"] * 5
    for f, field in zip(raw, ["top_k", "max_tokens", "stop_token_ids", "seed", "top_k"]):
        assert f.error.startswith(field), f.error
    assert client.wait_idle(TIMEOUT) and client.snapshot().num_used == 0


def test_a_failed_submit_leaves_no_state_and_its_id_is_reusable(client, solo):
    bad = [("bad \ud800 prompt", GOOD, "prompt is not valid Unicode"),
           ([2 ** 64], GOOD, "token ids must be in [0, "),
           ({"prompt_token_ids": [1, 2], "prompt": "\udfff"}, GOOD, "prompt is not valid")]
    for prompt, params, words in bad:
        with pytest.raises(InvalidRequestError) as info:
            client.submit(prompt, params, request_id="again")
        assert words in str(info.value)
        assert not client.outputs.has("again")
    with pytest.raises(InvalidRequestError, match="request_id is not valid Unicode"):
        client.submit(PROMPT, GOOD, request_id="\ud800")
    long = client.submit(PROMPT, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True),
                         request_id="again")
    with pytest.raises(InvalidRequestError, match="duplicate request id 'again'"):
        client.submit(PROMPT, GOOD, request_id="again")
    assert long.result(TIMEOUT).outputs[0].finish_reason == "length"    # the first is intact
    again = client.submit(PROMPT, GOOD, request_id="again").result(TIMEOUT)
    assert list(again.outputs[0].token_ids) == solo
    for rid in ("\ud800", "", 5, None, "x" * 10000, "never-submitted"):
        client.cancel(rid)                          # nothing to cancel: no exception
    assert client.wait_idle(TIMEOUT)
    assert client.outputs.states == {}              # nothing leaked in the front
    assert client.fatal_error is None


def test_a_wrong_typed_raw_submit_is_refused_naming_the_field(client, solo):
    """msgspec checks every field's type as the core decodes a Submit: the sender's
    request ends with an error naming the field, and the engine serves on."""
    ids = list(client.inputs.process(PROMPT)[0].prompt_token_ids)
    cases = [({"max_tokens": "8"}, ids, "max_tokens: Expected `int | null`, got `str`"),
             ({"max_tokens": None}, ids, "max_tokens None reached the engine: the front "
                                         "resolves it for the prompt (InputProcessor)"),
             ({"temperature": True}, ids, "temperature: Expected `float`, got `bool`"),
             ({"stop": 5}, ids, "stop: Expected `str | array | null`, got `int`"),
             ({"beam_width": 5}, ids, "Object contains unknown field `beam_width`"),
             ({"max_tokens": 4}, ["1"] + ids, "prompt_token_ids[0]: Expected `int`, got `str`"),
             ({"top_p": 2.0}, ids, "top_p must be in (0, 1], got 2.0")]
    for n, (params, prompt_ids, message) in enumerate(cases):
        fin = raw_submit(client.address, f"typed-{n}", params, prompt_ids)
        assert (fin.finish_reason, fin.error) == ("error", message)
    out = client.submit(PROMPT, GOOD).result(TIMEOUT)
    assert list(out.outputs[0].token_ids) == solo and client.fatal_error is None
    assert client.wait_idle(TIMEOUT) and client.snapshot().num_used == 0


HOSTILE_BODIES = [  # (body changes, words of the 400's message)
    ({"top_k": 2 ** 64}, "top_k must be an integer in [-1, 2147483647]"),
    ({"top_k": 2 ** 63, "temperature": 1}, "top_k must be an integer in [-1, 2147483647]"),
    ({"stop_token_ids": [2 ** 64]}, "stop_token_ids entry must be an integer in [0, "),
    ({"seed": 2 ** 70}, "seed must be an integer in [-9223372036854775808, "),
    ({"stop": ["\ud800"]}, "stop is not valid Unicode"),
    ({"prompt": "a\ud800b"}, "prompt is not valid Unicode"),
]


def test_hostile_values_over_http_get_a_400_naming_the_field(client):
    """The same boundary behind `roseplay serve` (its app on this engine process)."""
    import json

    from fastapi.testclient import TestClient

    from roseplay.serve.app import build_app
    with TestClient(build_app(client), raise_server_exceptions=False) as http:
        for changes, words in HOSTILE_BODIES:
            body = {"model": "default", "prompt": PROMPT, "max_tokens": 8, **changes}
            r = http.post("/v1/completions", content=json.dumps(body),   # lone surrogates:
                          headers={"content-type": "application/json"})  # json.dumps escapes
            assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
        chat = {"model": "default", "max_tokens": 8,
                "messages": [{"role": "user", "content": "hi \udfff"}]}
        r = http.post("/v1/chat/completions", content=json.dumps(chat),
                      headers={"content-type": "application/json"})
        assert r.status_code == 400 and "messages is not valid Unicode" in r.text
        r = http.post("/v1/completions", json={"model": "default", "prompt": PROMPT,
                                               "max_tokens": 8, "temperature": 0,
                                               "ignore_eos": True})
        assert r.status_code == 200
    assert client.wait_idle(TIMEOUT) and client.outputs.states == {}
