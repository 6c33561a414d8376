"""vLLM's structural tags and whitespace pattern over HTTP with the official openai client
(docs/STRUCTURED_OUTPUTS.md): response_format {"type": "structural_tag", ...} (both of
vLLM's forms) and structured_outputs.structural_tag / whitespace_pattern; a shape or a
feature the backend cannot do is a 400 naming the field. response_format's
structural_tag was a 400 ("type must be text, json_object or json_schema") and the
structured_outputs fields were refused as unknown."""
from __future__ import annotations

import json

import openai
import pytest

from engine.front.loop import EngineLoop
from roseplay.serve.app import build_app
from roseplay.serve.server import ServerThread
from tests.engine.core.test_structured_tags import FORMAT, PROMPT, SCHEMA, TAG

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module", params=["guidance", "xgrammar"])
def served(request):
    with EngineLoop(device="cpu", structured_outputs_config={"backend": request.param}) \
            as loop, ServerThread(build_app(loop)) as srv, \
            openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0) as c:
        yield request.param, c


def complete(client, max_tokens=40, **body):
    return client.completions.create(model="default", prompt=PROMPT, temperature=0,
                                     max_tokens=max_tokens, extra_body=body).choices[0]


def tag_body(text: str) -> dict:
    """The JSON between the tag's begin ("I am ") and end (".")."""
    head, _, rest = text.partition("I am ")
    assert head == "", text
    return json.loads(rest.partition(".")[0])


@pytest.mark.parametrize("field", ["response_format", "structured_outputs"])
def test_a_structural_tag_constrains_its_body(served, field):
    name, client = served
    body = ({"response_format": TAG} if field == "response_format"
            else {"structured_outputs": {"structural_tag": json.dumps(TAG)}})
    choice = complete(client, max_tokens=60, **body)
    if name == "guidance":
        assert tag_body(choice.text)["who"] in ("nurse", "friar")
    else:            # xgrammar's tag bodies take any whitespace: the model fills it
        assert choice.text.startswith("I am {"), choice.text


def test_the_format_form_is_xgrammars(served):
    name, client = served
    if name == "xgrammar":
        assert complete(client, response_format=FORMAT).text.startswith("I am {")
        return
    with pytest.raises(openai.BadRequestError) as err:
        complete(client, response_format=FORMAT)
    assert err.value.body["param"] == "response_format"
    assert "needs the xgrammar backend" in err.value.body["message"]


def test_whitespace_pattern(served):
    name, client = served
    so = {"json": SCHEMA, "whitespace_pattern": "[ ]{0,3}"}
    if name == "guidance":
        text = complete(client, structured_outputs=so).text
        assert json.loads(text) is not None and "  " in text, text
        return
    with pytest.raises(openai.BadRequestError) as err:
        complete(client, structured_outputs=so)
    assert err.value.body["param"] == "structured_outputs"
    assert "whitespace_pattern is not supported by the xgrammar backend" in \
        err.value.body["message"]


def test_guided_whitespace_pattern_is_whitespace_pattern(served):
    """vLLM's older guided_whitespace_pattern beside guided_json shapes the JSON as
    whitespace_pattern does (it was taken and ignored); alone it is a 400 naming it."""
    name, client = served
    if name == "guidance":
        old = complete(client, guided_json=SCHEMA, guided_whitespace_pattern="[ ]{0,3}").text
        assert old == complete(client, structured_outputs={
            "json": SCHEMA, "whitespace_pattern": "[ ]{0,3}"}).text
        assert "  " in old, old
    with pytest.raises(openai.BadRequestError) as err:
        complete(client, guided_whitespace_pattern="[ ]?")
    assert err.value.body["param"] == "guided_whitespace_pattern"


@pytest.mark.parametrize("fmt, says", [
    ({"type": "structural_tag"}, "or a `format` object"),
    ({"type": "structural_tag", "triggers": ["<"], "structures": [
        {"begin": "x", "schema": {}, "end": ""}]}, "starts with none of the triggers"),
])
def test_a_bad_structural_tag_is_a_400_naming_its_field(served, fmt, says):
    client = served[1]
    with pytest.raises(openai.BadRequestError) as err:
        complete(client, response_format=fmt)
    assert err.value.body["param"] == "response_format" and says in err.value.body["message"]
