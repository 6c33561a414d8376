"""vLLM's chat_template_kwargs (chat completions and /tokenize): extra variables for the
chat template, those it reads (others dropped, as vLLM), over the request's own
(add_generation_prompt); the template's and the renderer's own names refused with a 400
naming the field. The bundled model, a --chat-template that reads enable_thinking."""
from __future__ import annotations

import httpx
import pytest

from engine.front import chat_template
from engine.front.loop import EngineLoop
from engine.tokenizer import DEFAULT_MODEL_DIR, load_tokenizer_dir
from roseplay.serve import chat
from roseplay.serve.app import ServeConfig, build_app
from roseplay.serve.server import ServerThread

pytestmark = pytest.mark.timeout(300)
THINK_TEMPLATE = ("{% if documents %}{% for d in documents %}[doc {{ d['title'] }}]\n"
                  "{% endfor %}{% endif %}{% if tools %}[tools {{ tools | length }}]\n"
                  "{% endif %}{% if reasoning_effort %}"
                  "[effort {{ reasoning_effort }}]\n{% endif %}"
                  "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
                  "{% if enable_thinking is defined and not enable_thinking %}[silent]\n"
                  "{% endif %}{% if add_generation_prompt %}JULIET.\n{% endif %}")
MESSAGES = [{"role": "user", "content": "What news from the court?"}]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer_dir(str(DEFAULT_MODEL_DIR))


@pytest.fixture(scope="module")
def http():
    with EngineLoop(device="cpu") as loop, \
            ServerThread(build_app(loop, ServeConfig(chat_template=THINK_TEMPLATE))) as srv, \
            httpx.Client(base_url=srv.url, timeout=120) as client:
        yield client


def ids(tok, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def test_chat_template_kwargs_reach_the_template(http, tok):
    body = {"messages": MESSAGES, "max_tokens": 1, "return_token_ids": True}
    plain = http.post("/v1/chat/completions", json=body).json()
    quiet = http.post("/v1/chat/completions", json={
        **body, "chat_template_kwargs": {"enable_thinking": False}}).json()
    text = "What news from the court?\n"
    assert plain["prompt_token_ids"] == ids(tok, text + "JULIET.\n")
    assert quiet["prompt_token_ids"] == ids(tok, text + "[silent]\nJULIET.\n")
    assert quiet["usage"]["prompt_tokens"] == len(quiet["prompt_token_ids"])
    # /tokenize renders as the chat does; a kwarg sets add_generation_prompt, as vLLM's
    r = http.post("/tokenize", json={"messages": MESSAGES, "chat_template_kwargs": {
        "enable_thinking": False, "add_generation_prompt": False}})
    assert r.status_code == 200 and r.json()["tokens"] == ids(tok, text + "[silent]\n")


@pytest.mark.parametrize("kwargs, says", [
    ({"chat_template": "{{ messages }}"}, "cannot set chat_template"),
    ({"tokenize": True}, "cannot set tokenize"),
    ({"messages": []}, "cannot set messages"),
    (["enable_thinking"], "must be an object"),
])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_what_chat_template_kwargs_cannot_set_is_a_400(http, path, kwargs, says):
    r = http.post(path, json={"messages": MESSAGES, "max_tokens": 1,
                              "chat_template_kwargs": kwargs})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "chat_template_kwargs" and says in err["message"], err


def test_kwargs_the_template_does_not_read_are_dropped(tok):
    """The bundled model's play template reads no enable_thinking: the prompt is the
    same (a name of the renderer's, return_dict, never reaches it)."""
    want = chat_template.render(tok, chat_template.PLAY_TEMPLATE, MESSAGES)
    for kwargs in ({"enable_thinking": False}, {"return_dict": True, "x": [1]}):
        assert chat_template.render(tok, chat_template.PLAY_TEMPLATE, MESSAGES,
                                    template_kwargs=kwargs) == want
    assert chat_template.template_variables(THINK_TEMPLATE) == {
        "messages", "enable_thinking", "add_generation_prompt", "documents", "reasoning_effort",
        "tools"}


def test_documents_and_reasoning_effort_reach_the_template(http, tok):
    """vLLM passes a chat's `documents` (RAG templates read them) and OpenAI's
    `reasoning_effort` to the template; both were ignored. reasoning_effort wins over a
    chat_template_kwargs of that name, as vLLM sets it last."""
    body = {"messages": MESSAGES, "max_tokens": 1, "return_token_ids": True,
            "documents": [{"title": "Verona", "text": "Two households."}],
            "reasoning_effort": "low",
            "chat_template_kwargs": {"reasoning_effort": "high", "enable_thinking": False}}
    r = http.post("/v1/chat/completions", json=body).json()
    assert r["prompt_token_ids"] == ids(tok, "[doc Verona]\n[effort low]\nWhat news from the "
                                             "court?\n[silent]\nJULIET.\n"), r
    for field, value in (("documents", ["Verona"]), ("documents", {"title": "x"}),
                         ("reasoning_effort", "extreme")):
        r = http.post("/v1/chat/completions", json={**body, field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text


def test_tokenize_renders_a_chat_s_tools(http, tok):
    """vLLM's /tokenize of messages takes the chat's `tools`, which a template writes into
    the prompt: the count is the chat's. They were ignored (a shorter count)."""
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    body = {"messages": MESSAGES, "tools": tools}
    chat = http.post("/v1/chat/completions", json={**body, "max_tokens": 1,
                                                   "return_token_ids": True}).json()
    want = ids(tok, "[tools 1]\nWhat news from the court?\nJULIET.\n")
    assert chat["prompt_token_ids"] == want
    r = http.post("/tokenize", json=body)
    assert r.status_code == 200 and r.json()["tokens"] == want, r.text
    r = http.post("/tokenize", json={**body, "tools": [{"type": "function"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text


@pytest.fixture(scope="module")
def quiet_http():
    """A server started with --default-chat-template-kwargs '{"enable_thinking": false}'."""
    config = ServeConfig(chat_template=THINK_TEMPLATE,
                         default_chat_template_kwargs={"enable_thinking": False})
    with EngineLoop(device="cpu") as loop, ServerThread(build_app(loop, config)) as srv, \
            httpx.Client(base_url=srv.url, timeout=120) as client:
        yield client


def test_default_chat_template_kwargs_go_under_the_request_s(quiet_http, tok):
    """vLLM's --default-chat-template-kwargs: every chat (and /tokenize of messages) gets
    them; a request's chat_template_kwargs win key by key."""
    body = {"messages": MESSAGES, "max_tokens": 1, "return_token_ids": True}
    text = "What news from the court?\n"
    quiet = quiet_http.post("/v1/chat/completions", json=body).json()
    assert quiet["prompt_token_ids"] == ids(tok, text + "[silent]\nJULIET.\n")
    loud = quiet_http.post("/v1/chat/completions", json={
        **body, "chat_template_kwargs": {"enable_thinking": True}}).json()
    assert loud["prompt_token_ids"] == ids(tok, text + "JULIET.\n")
    r = quiet_http.post("/tokenize", json={"messages": MESSAGES})
    assert r.status_code == 200 and r.json()["tokens"] == quiet["prompt_token_ids"]


@pytest.mark.parametrize("value, says", [
    ("not json", "not JSON (an object"),
    ('["enable_thinking"]', "the default chat_template_kwargs must be an object"),
    ('{"tokenize": true}', "the default chat_template_kwargs cannot set tokenize"),
])
def test_a_bad_default_chat_template_kwargs_is_exit_2(value, says, capsys):
    from roseplay.cli import main
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--device", "cpu", "--port", "0", "--default-chat-template-kwargs",
              value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --default-chat-template-kwargs: {says}" in err, err
    assert "Traceback" not in err
    with pytest.raises(ValueError, match="default_chat_template_kwargs: the default"):
        ServeConfig(default_chat_template_kwargs=["enable_thinking"])


def test_a_template_text_longer_than_a_file_name_is_read_as_text():
    """--chat-template takes a file or the template itself: a text over 255 characters
    without a slash made the file check raise ENAMETOOLONG, and the server did not start."""
    assert len(THINK_TEMPLATE) > 255 and "/" not in THINK_TEMPLATE
    assert chat.load_template(THINK_TEMPLATE) == THINK_TEMPLATE


TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {}}}]


def test_tool_choice_none_keeps_the_tools_in_the_template_unless_told(http, tok):
    """vLLM renders a chat's tools with tool_choice none too (the model may only not call
    them; they were left out), and leaves them out under
    --exclude-tools-when-tool-choice-none."""
    body = {"messages": MESSAGES, "max_tokens": 1, "return_token_ids": True,
            "tools": TOOLS, "tool_choice": "none"}
    text = "[tools 1]\nWhat news from the court?\nJULIET.\n"
    assert http.post("/v1/chat/completions", json=body).json()["prompt_token_ids"] == \
        ids(tok, text)
    config = ServeConfig(chat_template=THINK_TEMPLATE, exclude_tools_when_tool_choice_none=True)
    with EngineLoop(device="cpu") as loop, ServerThread(build_app(loop, config)) as srv:
        r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=120).json()
        assert r["prompt_token_ids"] == ids(tok, text.removeprefix("[tools 1]\n"))
        auto = httpx.post(srv.url + "/v1/chat/completions", timeout=120,
                          json={**body, "tool_choice": "auto"}).json()
        assert auto["prompt_token_ids"] == ids(tok, text)
