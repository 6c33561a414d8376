"""The sampling surface through `roseplay serve`'s app with the engine in its own process
(EngineClient, the default path) and the official openai client: logprobs (completions
and chat, streamed and not, equal to each other and to the engine's), every penalty /
bias / min_p / min_tokens field, best_of picking the highest cumulative logprob, and
completions `echo` + `logprobs` (OpenAI's legacy prompt logprobs: the prompt's tokens
first, the first with null logprob, equal to the engine's prompt_logprobs)."""
from __future__ import annotations

import openai
import pytest

from engine import SamplingParams
from engine.front.client import EngineClient
from roseplay.serve.app import ServeConfig, build_app
from roseplay.serve.server import ServerThread

PROMPT = "ROMEO.\nWhat news from the court?\n\nJULIET.\n"
ECHO_PROMPT = "ROMEO.\nWhat news from the court?\n"
CHAT = [{"role": "user", "content": "What news from the court?"}]
EXTRAS = dict(repetition_penalty=1.2, min_p=0.05, min_tokens=3)


@pytest.fixture(scope="module")
def loop():
    loop = EngineClient(device="cpu", num_blocks=256)
    yield loop
    loop.close()
    assert loop.proc.poll() is not None


@pytest.fixture(scope="module")
def client(loop):
    srv = ServerThread(build_app(loop, ServeConfig())).start()
    with openai.OpenAI(base_url=srv.url + "/v1", api_key="-", max_retries=0, timeout=60) as c:
        yield c
    srv.stop()


def _streamed_completion(client, kw: dict) -> tuple[str, list, list, list]:
    """A streamed completion's text, and its chunks' logprobs joined: tokens, values,
    text offsets."""
    tokens, values, offsets, text = [], [], [], ""
    for chunk in client.completions.create(**kw, stream=True):
        c = chunk.choices[0]
        text += c.text
        if c.logprobs is not None:
            tokens += c.logprobs.tokens
            values += c.logprobs.token_logprobs
            offsets += c.logprobs.text_offset
    return text, tokens, values, offsets


def test_completion_logprobs_streamed_and_not(client, loop):
    kw = dict(model="default", prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3)
    full = client.completions.create(**kw).choices[0]
    lp = full.logprobs
    assert "".join(lp.tokens) == full.text and len(lp.tokens) == 6
    assert lp.text_offset == [sum(map(len, lp.tokens[:i])) for i in range(6)]
    assert all(len(top) in (3, 4) and max(top.values()) == v          # greedy: the top one
               for top, v in zip(lp.top_logprobs, lp.token_logprobs))
    engine = loop.submit(PROMPT, SamplingParams(max_tokens=6, temperature=0, logprobs=3)
                         ).result(60).outputs[0]
    assert lp.token_logprobs == pytest.approx([e.logprobs[0] for e in engine.logprobs])
    text, tokens, values, offsets = _streamed_completion(client, kw)
    assert (text, tokens, offsets) == (full.text, lp.tokens, lp.text_offset)
    assert values == pytest.approx(lp.token_logprobs)


def test_chat_logprobs_streamed_and_not(client):
    kw = dict(model="default", messages=CHAT, max_tokens=5, temperature=0, logprobs=True,
              top_logprobs=2)
    full = client.chat.completions.create(**kw).choices[0]
    content = full.logprobs.content
    assert "".join(t.token for t in content) == full.message.content
    for t in content:
        assert len(t.top_logprobs) == 2 and t.top_logprobs[0].token == t.token
        assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob
        assert t.bytes == list(t.token.encode())
    streamed = [t for chunk in client.chat.completions.create(**kw, stream=True)
                for ch in chunk.choices if ch.logprobs for t in ch.logprobs.content]
    assert [(t.token, t.logprob) for t in streamed] == \
        [(t.token, pytest.approx(t.logprob)) for t in content]
    plain = client.chat.completions.create(model="default", messages=CHAT, max_tokens=5,
                                           temperature=0).choices[0]
    assert plain.logprobs is None and plain.message.content == full.message.content


def test_every_sampling_field_through_openai(client, loop):
    """Penalties, logit_bias (string keys), min_p, min_tokens, repetition_penalty: the
    server's tokens are the engine's for the same SamplingParams, streamed and not."""
    bias = {"5": 2.0, "17": -100}
    kw = dict(model="default", prompt=PROMPT, max_tokens=8, temperature=0.8, seed=11,
              presence_penalty=0.4, frequency_penalty=0.6, logit_bias=bias,
              extra_body={**EXTRAS, "return_token_ids": True})
    got = client.completions.create(**kw).choices[0]
    engine = loop.submit(PROMPT, SamplingParams(
        max_tokens=8, temperature=0.8, seed=11, presence_penalty=0.4, frequency_penalty=0.6,
        logit_bias={5: 2.0, 17: -100.0}, **EXTRAS)).result(60).outputs[0]
    assert got.text == engine.text and got.token_ids == list(engine.token_ids)
    assert 17 not in got.token_ids and len(got.token_ids) >= 3
    streamed = "".join(c.choices[0].text for c in client.completions.create(**kw, stream=True))
    assert streamed == got.text
    chat = client.chat.completions.create(model="default", messages=CHAT, max_tokens=6,
                                          temperature=0, frequency_penalty=2.0,
                                          logit_bias={"5": 1.0}, extra_body=EXTRAS)
    assert chat.choices[0].finish_reason in ("length", "stop")
    assert chat.usage.completion_tokens >= 3


def test_best_of_returns_the_highest_cumulative_logprob(client):
    """Candidate i of a seeded request samples with seed + i, so n=4 shows every
    candidate's summed logprob; best_of=4, n=2 returns the two best, best first."""
    kw = dict(model="default", prompt=PROMPT, max_tokens=6, temperature=1.0, seed=3)
    every = client.completions.create(**kw, n=4, logprobs=0).choices
    ranked = sorted(every, key=lambda c: sum(c.logprobs.token_logprobs), reverse=True)
    best = client.completions.create(**kw, n=2, best_of=4).choices
    assert [c.text for c in best] == [c.text for c in ranked[:2]]
    assert [c.index for c in best] == [0, 1] and best[0].logprobs is None
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(**kw, best_of=4, stream=True)
    assert exc.value.body["param"] == "best_of"


def test_echo_logprobs_prompt_first_equal_engine(client, loop):
    kw = dict(model="default", prompt=ECHO_PROMPT, max_tokens=4, temperature=0, logprobs=2,
              echo=True)
    full = client.completions.create(**kw).choices[0]
    lp = full.logprobs
    engine = loop.submit(ECHO_PROMPT, SamplingParams(max_tokens=4, temperature=0, logprobs=2,
                                                prompt_logprobs=2)).result(60)
    n_prompt = len(engine.prompt_token_ids)
    assert len(lp.tokens) == n_prompt + 4 and full.text.startswith(ECHO_PROMPT)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.text_offset[0] == 0
    assert "".join(lp.tokens[:n_prompt]) == ECHO_PROMPT
    want = [e.logprobs[0] for e in engine.prompt_logprobs[1:]] + \
        [e.logprobs[0] for e in engine.outputs[0].logprobs]
    assert lp.token_logprobs[1:] == pytest.approx(want, abs=1e-5)
    assert all(len(top) in (2, 3) for top in lp.top_logprobs[1:])
    # streamed: the prompt's entries ride on the first chunk, with the echoed text
    text, tokens, values, _ = _streamed_completion(client, kw)
    assert (text, tokens) == (full.text, lp.tokens)
    assert values[0] is None and values[1:] == pytest.approx(lp.token_logprobs[1:], abs=1e-5)


def test_echo_without_logprobs_and_chat_unchanged(client):
    """echo alone asks no prompt logprobs; chat has none (OpenAI)."""
    plain = client.completions.create(model="default", prompt=ECHO_PROMPT, max_tokens=2,
                                      temperature=0, echo=True).choices[0]
    assert plain.logprobs is None and plain.text.startswith(ECHO_PROMPT)
    chat = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
        temperature=0, logprobs=True)
    assert len(chat.choices[0].logprobs.content) == chat.usage.completion_tokens == 2
