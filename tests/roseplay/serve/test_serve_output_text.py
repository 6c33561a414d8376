"""vLLM's output-text fields over HTTP, skip_special_tokens and
spaces_between_special_tokens (SamplingParams' own): they were taken and ignored, so a
client asking to see the special tokens got the text without them. The engine in its own
process, the bundled model (its EOS, id 0, forced by a bias and kept by ignore_eos),
127.0.0.1."""
from __future__ import annotations

import json

import pytest

from roseplay.serve.body import parse_body
from roseplay.serve.protocol import ChatCompletionRequest, CompletionRequest

pytestmark = pytest.mark.timeout(120)
EOS = "<|endoftext|>"
FORCED = {"max_tokens": 3, "temperature": 0, "ignore_eos": True, "logit_bias": {"0": 100}}
BODIES = {"/v1/completions": {"prompt": "ROMEO.\n", **FORCED},
          "/v1/chat/completions": {"messages": [{"role": "user", "content": "Speak."}],
                                   **FORCED}}


def text_of(http, path: str, body: dict, stream: bool) -> str:
    """The first choice's text, whole or streamed."""
    if not stream:
        r = http.post(path, json=body)
        assert r.status_code == 200, r.text
        c = r.json()["choices"][0]
        return c["text"] if "text" in c else c["message"]["content"]
    out = []
    with http.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for c in json.loads(line[6:])["choices"]:
                    out.append(c.get("text") or (c.get("delta") or {}).get("content") or "")
    return "".join(out)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", list(BODIES))
def test_skip_special_tokens_false_shows_them(http, path, stream):
    body = BODIES[path]
    assert text_of(http, path, body, stream) == ""
    assert text_of(http, path, {**body, "skip_special_tokens": False}, stream) == EOS * 3
    # byte-level BPE puts no space between tokens: nothing to take out
    assert text_of(http, path, {**body, "skip_special_tokens": False,
                                "spaces_between_special_tokens": False}, stream) == EOS * 3


@pytest.mark.parametrize("model", [CompletionRequest, ChatCompletionRequest])
def test_the_fields_reach_the_sampling_params(model):
    body = {"prompt": "x", "messages": [{"role": "user", "content": "x"}]}
    req = parse_body(model, json.dumps({**body, "skip_special_tokens": False,
                                        "spaces_between_special_tokens": False}).encode())
    req.check_supported()
    p = req.sampling_params(4)
    assert p.skip_special_tokens is False and p.spaces_between_special_tokens is False
    plain = parse_body(model, json.dumps(body).encode())
    plain.check_supported()
    p = plain.sampling_params(4)
    assert p.skip_special_tokens is True and p.spaces_between_special_tokens is True


@pytest.mark.parametrize("name", ["skip_special_tokens", "spaces_between_special_tokens"])
def test_a_non_boolean_is_a_400_naming_the_field(http, name):
    r = http.post("/v1/completions", json={**BODIES["/v1/completions"], name: "no"})
    assert r.status_code == 400 and r.json()["error"]["param"] == name, r.text
