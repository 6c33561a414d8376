"""Completions `echo` + `logprobs` (OpenAI's legacy prompt logprobs) through `roseplay
serve`'s app, the engine in its own process (the default path), and the official openai
client: the prompt's tokens come first (the first with null logprob), their values equal
the engine's prompt_logprobs, then the output's; streamed and not agree."""
from __future__ import annotations

import openai
import pytest

from engine import SamplingParams
from engine.front.client import EngineClient
from roseplay.serve.app import ServeConfig, build_app
from roseplay.serve.server import ServerThread

PROMPT = "ROMEO.\nWhat news from the court?\n"


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


def test_echo_logprobs_prompt_first_equal_engine(client, loop):
    kw = dict(model="default", prompt=PROMPT, max_tokens=4, temperature=0, logprobs=2,
              echo=True)
    full = client.completions.create(**kw).choices[0]
    lp = full.logprobs
    engine = loop.submit(PROMPT, SamplingParams(max_tokens=4, temperature=0, logprobs=2,
                                                prompt_logprobs=2)).result(60)
    n_prompt = len(engine.prompt_token_ids)
    assert len(lp.tokens) == n_prompt + 4 and full.text.startswith(PROMPT)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.text_offset[0] == 0
    assert "".join(lp.tokens[:n_prompt]) == PROMPT
    want = [e.logprobs[0] for e in engine.prompt_logprobs[1:]] + \
        [e.logprobs[0] for e in engine.outputs[0].logprobs]
    assert lp.token_logprobs[1:] == pytest.approx(want, abs=1e-5)
    assert all(len(top) in (2, 3) for top in lp.top_logprobs[1:])
    # streamed: the prompt's entries ride on the first chunk, with the echoed text
    tokens, values, text = [], [], ""
    for chunk in client.completions.create(**kw, stream=True):
        c = chunk.choices[0]
        text += c.text
        if c.logprobs is not None:
            tokens += c.logprobs.tokens
            values += c.logprobs.token_logprobs
    assert (text, tokens) == (full.text, lp.tokens)
    assert values[0] is None and values[1:] == pytest.approx(lp.token_logprobs[1:], abs=1e-5)


def test_echo_without_logprobs_and_chat_unchanged(client):
    """echo alone asks no prompt logprobs; chat has none (OpenAI)."""
    plain = client.completions.create(model="default", prompt=PROMPT, max_tokens=2,
                                      temperature=0, echo=True).choices[0]
    assert plain.logprobs is None and plain.text.startswith(PROMPT)
    chat = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
        temperature=0, logprobs=True)
    assert len(chat.choices[0].logprobs.content) == chat.usage.completion_tokens == 2
