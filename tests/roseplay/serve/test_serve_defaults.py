"""The model's generation config as `roseplay serve`'s default sampling parameters
(--generation-config, vLLM's): the bundled model's max_new_tokens (256) is the output
length of a request that sets none, at most the context's rest; a folder's file also
caps every request and fills the sampling fields a request leaves out; `vllm` reads
nothing. Real HTTP on 127.0.0.1: the engine in its own process for the bundled
model's file (its Welcome carries the defaults), in-process for the others."""
from __future__ import annotations

import json

import httpx
import pytest

from engine.front.client import EngineClient
from engine.front.loop import EngineLoop
from engine.outputs import EngineInfo
from roseplay.serve.app import build_app
from roseplay.serve.cli import defaults_line
from roseplay.serve.cli import main as serve_main
from roseplay.serve.server import ServerThread

pytestmark = pytest.mark.timeout(180)
CHAT = [{"role": "user", "content": "What news from the court?"}]
MAX_MODEL_LEN = 1024


def chat(url: str, **fields) -> dict:
    body = {"model": "default", "messages": CHAT, "ignore_eos": True, **fields}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def completion(url: str, **fields) -> dict:
    r = httpx.post(url + "/v1/completions", json={"model": "default", "ignore_eos": True,
                                                   **fields}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def bundled():
    """The bundled model (its generation_config.json: max_new_tokens 256), auto."""
    with EngineClient(device="cpu", max_model_len=MAX_MODEL_LEN, label="test-defaults",
                      snapshots=False) as loop, ServerThread(build_app(loop)) as srv:
        yield srv


def test_a_chat_without_max_tokens_stops_at_the_models_max_new_tokens(bundled):
    """It ran to the end of the context (1024 - prompt tokens here); vLLM's default
    is the generation config's max_new_tokens."""
    r = chat(bundled.url, temperature=0)
    assert (r["usage"]["completion_tokens"], r["choices"][0]["finish_reason"]) == (256, "length")
    assert chat(bundled.url, temperature=0, max_tokens=None,
                max_completion_tokens=None)["usage"]["completion_tokens"] == 256


def test_a_requested_max_tokens_is_not_capped_by_the_default(bundled):
    """From `auto` the file's max_new_tokens is a default, not a limit (vLLM's rule)."""
    assert chat(bundled.url, temperature=0, max_tokens=300)["usage"]["completion_tokens"] == 300


def test_completions_keep_16_and_null_takes_the_default_within_the_context(bundled):
    assert completion(bundled.url, prompt="ROMEO.", temperature=0)[
        "usage"]["completion_tokens"] == 16                    # OpenAI's completions default
    assert completion(bundled.url, prompt="ROMEO.", temperature=0, max_tokens=None)[
        "usage"]["completion_tokens"] == 256
    near_the_end = completion(bundled.url, prompt=[5] * 900, temperature=0, max_tokens=None)
    assert near_the_end["usage"]["completion_tokens"] == MAX_MODEL_LEN - 900   # not a 400


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A --generation-config folder: greedy with top_k 5, 12 tokens at most."""
    path = tmp_path_factory.mktemp("generation")
    (path / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.0, "top_k": 5, "top_p": None, "max_new_tokens": 12,
         "do_sample": False, "eos_token_id": 0}))
    with EngineLoop(device="cpu", generation_config=str(path)) as loop, \
            ServerThread(build_app(loop)) as srv:
        yield loop, srv


def test_a_folders_file_fills_what_a_request_leaves_out_and_caps_max_tokens(folder):
    loop, srv = folder
    assert (loop.info.default_sampling_params, loop.info.override_max_tokens) == \
        ({"temperature": 0.0, "top_k": 5, "max_tokens": 12}, 12)
    plain = chat(srv.url, seed=1)                       # greedy: the file's temperature
    assert plain["choices"][0]["message"]["content"] == \
        chat(srv.url, temperature=0, top_k=5, max_tokens=12)["choices"][0]["message"]["content"]
    assert plain["usage"]["completion_tokens"] == 12
    assert chat(srv.url, max_tokens=40)["usage"]["completion_tokens"] == 12     # capped
    assert completion(srv.url, prompt="ROMEO.", max_tokens=40)["usage"][
        "completion_tokens"] == 12


def test_the_responses_api_echoes_the_settings_it_ran_with(folder):
    """vLLM's Response object carries the sampling parameters as they ran: the model's
    defaults where the request set none, the request's own where it did."""
    _, srv = folder
    r = httpx.post(srv.url + "/v1/responses", json={"model": "default", "input": "Speak."},
                   timeout=60).json()
    assert (r["temperature"], r["top_p"], r["max_output_tokens"]) == (0.0, 1.0, 12)
    r = httpx.post(srv.url + "/v1/responses", json={
        "model": "default", "input": "Speak.", "temperature": 0.5, "max_output_tokens": 4},
        timeout=60).json()
    assert (r["temperature"], r["max_output_tokens"]) == (0.5, 4)


def test_generation_config_vllm_reads_nothing():
    """`vllm`: no defaults; a chat without max_tokens takes the rest of the context."""
    with EngineLoop(device="cpu", max_model_len=320, generation_config="vllm") as loop, \
            ServerThread(build_app(loop)) as srv:
        assert loop.info.default_sampling_params == {}
        r = chat(srv.url, temperature=0)
        assert r["usage"]["total_tokens"] == 320


def test_without_max_tokens_a_small_pool_is_the_contexts_end():
    """A KV pool that holds fewer tokens than max_model_len (16 blocks of 16: 256 of
    1,024): a chat or completion without max_tokens runs to the pool's end, as LLM's
    max_tokens=None; it was a 400 ('can never fit the KV pool')."""
    with EngineLoop(device="cpu", num_blocks=16, block_size=16, max_model_len=MAX_MODEL_LEN,
                    generation_config="vllm") as loop, ServerThread(build_app(loop)) as srv:
        assert chat(srv.url, temperature=0)["usage"]["total_tokens"] == 256
        r = completion(srv.url, prompt=[1, 2, 3], max_tokens=None, temperature=0)
        assert r["usage"]["total_tokens"] == 256


def test_the_start_line_names_the_defaults():
    """What vLLM's server logs at start ("Default sampling parameters have been
    overridden by the model's Hugging Face generation config ..."), with the values."""
    info = EngineInfo("m", 10, 64, 8, 16, "cpu", "float32", "torch",
                      default_sampling_params={"max_tokens": 256})
    line = defaults_line(info)
    assert line.startswith("Default sampling parameters have been overridden by the model's "
                           "Hugging Face generation config: max_tokens=256")
    assert "--generation-config vllm" in line and "caps" not in line
    capped = EngineInfo("m", 10, 64, 8, 16, "cpu", "float32", "torch",
                        default_sampling_params={"temperature": 0.6, "max_tokens": 12},
                        override_max_tokens=12)
    assert "temperature=0.6, max_tokens=12" in defaults_line(capped)
    assert "max_tokens 12 caps every request" in defaults_line(capped)
    assert defaults_line(EngineInfo("m", 10, 64, 8, 16, "cpu", "float32", "torch")) is None
    # an override's values were credited to the model's file alone
    assert "generation config and --override-generation-config: max_tokens=256" in \
        defaults_line(info, override=True)


def test_override_generation_config_sets_the_defaults():
    """vLLM's --override-generation-config over the bundled model's file: its
    max_new_tokens is the output length of a chat that sets none (the file's 256 else);
    a key that sets no default is exit 2 at the command line."""
    with EngineLoop(device="cpu", max_model_len=MAX_MODEL_LEN, override_generation_config={
            "max_new_tokens": 5, "temperature": 0}) as loop, \
            ServerThread(build_app(loop)) as srv:
        assert loop.info.default_sampling_params == {"max_tokens": 5, "temperature": 0}
        r = chat(srv.url)
        assert r["usage"]["completion_tokens"] == 5
        assert r["choices"][0]["finish_reason"] == "length"


def test_a_bad_override_is_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        serve_main(["--device", "cpu", "--override-generation-config", '{"do_sample": true}'])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "do_sample sets no sampling default" in err, err
