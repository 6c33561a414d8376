"""The front's check of a constraint at submit (engine/grammars.py) off the event loop:
a big schema's check (an event stands for a slow one) leaves another client's stream
running, its refusal is still the 400 naming the field, and which checks stay on the
loop (roseplay/serve/constrained.py check_on_loop)."""
from __future__ import annotations

import json
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from engine import grammars
from engine.front.loop import EngineLoop
from engine.structured_outputs import StructuredOutputsParams
from roseplay.serve.app import build_app
from roseplay.serve.constrained import ON_LOOP_SPEC_CHARS, check_on_loop
from roseplay.serve.server import ServerThread

pytestmark = pytest.mark.timeout(300)
BODY = {"model": "dummy:tiny", "prompt": [1, 2, 3], "temperature": 0}


def big_schema(**extra) -> dict:
    """A schema of real size (tens of KiB), its own each call (the front's cache)."""
    tag = uuid.uuid4().hex[:8]
    item = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 8},
                                             "b": {"enum": ["x", "y"]}}, "required": ["a"]}
    props = {f"f{tag}_{i}": item for i in range(400)}
    return {"type": "object", "properties": props, **extra}


@pytest.fixture(scope="module")
def server():
    with EngineLoop(model="dummy:tiny", device="cpu", num_blocks=64) as loop, \
            ServerThread(build_app(loop)) as srv:
        yield srv


def stream_events(url: str, body: dict, seen: list) -> None:
    """A streamed completion's SSE data lines, appended to `seen` as they come."""
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                seen.append(line[6:])


def test_a_big_schema_check_leaves_other_streams_running(server, monkeypatch):
    """While the check of a big schema is held (on its event), another client's stream
    runs to [DONE]; then the constrained request is answered. The check ran on the event
    loop: the other stream got nothing until it ended."""
    entered, gate = threading.Event(), threading.Event()
    refusal = grammars._refusal

    def held(p, backend):
        entered.set()
        assert gate.wait(120)
        return refusal(p, backend)

    monkeypatch.setattr(grammars, "_refusal", held)
    url = server.url + "/v1/completions"
    schema = {"type": "json_schema", "json_schema": {"name": "big", "schema": big_schema()}}
    assert len(json.dumps(schema)) > 16 * ON_LOOP_SPEC_CHARS
    seen: list[str] = []
    with ThreadPoolExecutor(2) as pool:
        try:
            big = pool.submit(httpx.post, url, timeout=120, json={
                **BODY, "max_tokens": 4, "response_format": schema})
            assert entered.wait(120)
            other = pool.submit(stream_events, url, {**BODY, "max_tokens": 8}, seen)
            other.result(timeout=120)
            assert not big.done()          # still in its check
        finally:
            gate.set()
        r = big.result()
    # (a loaded box may get all 8 tokens in one chunk: the chunks are not counted)
    assert seen[-1] == "[DONE]", seen
    assert json.loads(seen[-2])["choices"][0]["finish_reason"] == "length", seen
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("stream", [False, True])
def test_a_big_schema_refused_at_the_check_names_its_field(server, stream):
    r = httpx.post(server.url + "/v1/completions", timeout=120, json={
        **BODY, "max_tokens": 4, "stream": stream,
        "structured_outputs": {"json": big_schema(type="no-such-type")}})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "structured_outputs", err
    assert err["message"].startswith("structured output grammar"), err


def test_which_checks_stay_on_the_event_loop(monkeypatch):
    small = StructuredOutputsParams(regex="[ab]+")
    big = StructuredOutputsParams(json=big_schema())
    assert check_on_loop(None, "auto") and check_on_loop(StructuredOutputsParams(
        json_object=True), "xgrammar")
    import llguidance  # noqa: F401  (the default library, imported)
    assert check_on_loop(small, "auto") and not check_on_loop(big, "auto")
    monkeypatch.delitem(sys.modules, "xgrammar", raising=False)   # its first use
    assert not check_on_loop(small, "xgrammar")
