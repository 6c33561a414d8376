"""vLLM's answers that clients of its server read, through the official `openai` client
and raw JSON: the model card's permission, chat's top_logprobs 0, text parts, and
continue_final_message. The engine in its own process, the bundled model, 127.0.0.1
(conftest.py's server)."""
from __future__ import annotations

import openai
import pytest

pytestmark = pytest.mark.timeout(120)


def test_model_cards_carry_vllm_s_permission(server, http):
    """vLLM's card lists one permission object (OpenAI's old field, its defaults); it was
    left out, and clients written against vLLM read permission[0]."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0)
    for card in (client.models.list().data[0].model_dump(),
                 http.get("/v1/models/default").json()):
        perm, = card["permission"]
        assert perm["object"] == "model_permission" and perm["id"].startswith("modelperm-")
        assert (perm["allow_sampling"], perm["allow_logprobs"], perm["organization"],
                perm["allow_fine_tuning"]) == (True, True, "*", False)


def test_chat_top_logprobs_0_without_logprobs_asks_for_nothing(server):
    """top_logprobs 0 with logprobs false or left out (what clients that send every field
    write) is served without logprobs, as vLLM's; it was a 400. A top_logprobs above 0
    without logprobs stays one."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0)
    body = dict(model="default", messages=[{"role": "user", "content": "What news?"}],
                max_tokens=2, temperature=0, top_logprobs=0)
    for logprobs in ({}, {"logprobs": False}):
        r = client.chat.completions.create(**body, **logprobs)
        assert r.choices[0].logprobs is None and r.usage.completion_tokens == 2
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**{**body, "top_logprobs": 1})
    assert e.value.body["param"] == "top_logprobs"


def test_text_parts_are_joined_one_per_line(http):
    """A message whose content is text parts reaches the template as vLLM gives a
    template that reads a string: the parts joined by newlines (they ran together)."""
    def prompt(content):
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": 1,
                "return_token_ids": True}
        return http.post("/v1/chat/completions", json=body).json()["prompt_token_ids"]
    parts = [{"type": "text", "text": "What news"}, {"type": "text", "text": "from the court?"}]
    assert prompt(parts) == prompt("What news\nfrom the court?") != prompt(
        "What newsfrom the court?")


def test_continue_final_message_goes_on_with_the_last_message(http):
    """vLLM's continue_final_message (with add_generation_prompt false): the prompt ends
    with the last message's text, not its end of turn, and the reply continues it (the
    greedy completion of those ids); /tokenize renders it alike. It was refused."""
    turns = [{"role": "user", "content": "What news from the court?"},
             {"role": "assistant", "content": "The King"}]
    body = {"messages": turns, "add_generation_prompt": False, "continue_final_message": True,
            "max_tokens": 6, "temperature": 0, "return_token_ids": True, "echo": True}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    ids = r.json()["prompt_token_ids"]
    assert http.post("/detokenize", json={"tokens": ids}).json()["prompt"].endswith(
        "JULIET.\nThe King")
    assert http.post("/tokenize", json={k: body[k] for k in (
        "messages", "add_generation_prompt", "continue_final_message")}).json()["tokens"] == ids
    content = r.json()["choices"][0]["message"]["content"]
    going_on = http.post("/v1/completions", json={"prompt": ids, "max_tokens": 6,
                                                  "temperature": 0}).json()
    assert content == "The King" + going_on["choices"][0]["text"]
