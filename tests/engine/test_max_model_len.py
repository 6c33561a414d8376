"""max_model_len above the model's is refused, as vLLM refuses it (it was lowered to the
model's without a word): the rule in engine/config.py resolve_max_model_len, the
model's length from its config (engine/worker/models/config_check.py), checked before
the load and again on the loaded config."""
import pytest

from engine.config import (DEFAULT_MAX_MODEL_LEN, InvalidRequestError, parse_token_count,
                           resolve_max_model_len)
from engine.worker.models.config_check import context_length, local_context_length
from engine.worker.models.presets import PRESETS, preset_config

TINY = ("max_position_embeddings", 2048)     # dummy:tiny's


def test_the_rule():
    assert resolve_max_model_len(None, TINY) == min(DEFAULT_MAX_MODEL_LEN, 2048)
    assert resolve_max_model_len(None, ("n_positions", 100_000)) == DEFAULT_MAX_MODEL_LEN
    assert resolve_max_model_len(2048, TINY) == 2048 and resolve_max_model_len(7, TINY) == 7
    with pytest.raises(ValueError, match=r"^max_model_len \(2049\) is greater than the model's "
                                         r"maximum \(max_position_embeddings=2048 in its "
                                         r"config\): give at most 2048"):
        resolve_max_model_len(2049, TINY)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_the_length_read_here_is_the_loaded_configs(preset):
    """The light read (no transformers) before the load gives what the loader reads."""
    assert local_context_length(f"dummy:{preset}")[1] == \
        context_length(preset_config(preset))[1]


def test_local_context_length_of_names():
    assert local_context_length("default") == ("max_position_embeddings", 1024)
    assert local_context_length("dummy:gpt2") == ("n_positions", 1024)
    assert local_context_length("org/not-fetched") is None    # a hub id: not fetched
    assert local_context_length("dummy:nope") is None          # the loader names it
    assert local_context_length(7) is None


def test_checkpoint_directory(ckpt, tmp_path):
    assert local_context_length(str(ckpt)) == ("max_position_embeddings", 2048)
    assert local_context_length(str(tmp_path)) is None        # no config.json


def test_llm_refuses_it_and_takes_the_models_own():
    from engine import LLM
    with pytest.raises(InvalidRequestError, match=r"max_model_len \(100000\) is greater than "
                                                  r"the model's maximum"):
        LLM(model="dummy:tiny", device="cpu", num_blocks=64, max_model_len=100_000)
    with LLM(model="dummy:tiny", device="cpu", num_blocks=64, max_model_len=2048) as llm:
        assert llm.engine.max_model_len == 2048


def test_a_hub_model_is_checked_on_its_loaded_config(monkeypatch):
    """A model not read before the load (a hub id) is refused on the loaded config."""
    from engine import LLM
    from engine.worker.executor import setup
    monkeypatch.setattr(setup, "local_context_length", lambda name, files=None: None)
    with pytest.raises(InvalidRequestError, match=r"max_model_len \(4096\) is greater"):
        LLM(model="dummy:tiny", device="cpu", num_blocks=64, max_model_len=4096)


@pytest.mark.timeout(120)
def test_the_engine_process_refuses_it():
    from engine.front.client import EngineClient
    with pytest.raises(InvalidRequestError, match=r"max_model_len \(4096\) is greater"):
        EngineClient(model="dummy:tiny", device="cpu", snapshots=False, max_model_len=4096)


@pytest.mark.parametrize("text,tokens", [("4096", 4096), ("32k", 32_000), ("25.6k", 25_600),
                                         ("1.1k", 1_100), ("32K", 32_768), ("1M", 2 ** 20),
                                         ("1m", 10 ** 6), (" 8k ", 8_000)])
def test_flag_takes_vllms_token_counts(text, tokens):
    """--max-model-len 32k (vLLM's human-readable count) was refused: expected int."""
    from roseplay.cli import build_parser
    assert parse_token_count(text) == tokens
    assert build_parser().parse_args(["--max-model-len", text]).max_model_len == tokens


@pytest.mark.parametrize("text,why", [("1.5K", "a binary suffix takes a whole number: 1.5k"),
                                      ("0.0001k", "not a whole number of tokens"),
                                      ("2.5", "not a whole number of tokens"),
                                      ("1e3", "a whole number, with k"), ("-1", "a whole number"),
                                      ("k", "a whole number")])
def test_flag_refuses_other_counts_saying_why(text, why, capsys):
    from roseplay.cli import build_parser
    with pytest.raises(ValueError, match=why):
        parse_token_count(text)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--max-model-len", text])
    assert f"max_model_len expects int, got {text!r} ({why}" in capsys.readouterr().err
