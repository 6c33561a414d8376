"""The bundled default model (engine/assets/shakespeare) writes Shakespeare-like words.

Greedy continuations of a few prompts must be made mostly (>= 85% of word tokens) of
words that occur in the model's training texts. The word list is
engine/assets/shakespeare/words.txt (unique lowercase words of the training split, built
by `scripts/train_default_model.py prepare`); words are lowercase runs of ASCII letters,
the same split as scripts/shakespeare_data.words_of. Checked through the engine and,
independently, through transformers on the same files.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ASSETS = Path(__file__).resolve().parents[3] / "engine" / "assets" / "shakespeare"
PROMPTS = [
    "ROMEO.\n",
    "KING LEAR.\nBlow, winds, and crack your cheeks!",
    "HAMLET.\nTo be, or not to be, that is the question:\n",
    "FIRST WITCH.\nWhen shall we three meet again?\n",
    "Shall I compare thee to a summer's day?\n",
]
MAX_TOKENS = 64
MIN_FRACTION = 0.85     # per prompt, of word tokens found in words.txt
MIN_WORDS = 15          # per prompt: a real continuation, not a few tokens
MIN_DISTINCT = 8        # per prompt: not one word repeated (a random-init model's greedy
                        # output is 1-2 distinct tokens repeated, often real words)
SAMPLED_MIN_FRACTION = 0.85   # pooled over prompts, temperature 0.8 (random init: ~0.4)

_WORD_RE = re.compile(r"[a-z]+")


def words_of(text: str) -> list[str]:
    return _WORD_RE.findall(text.lower())


@pytest.fixture(scope="module")
def vocab() -> frozenset[str]:
    words = (ASSETS / "words.txt").read_text().split()
    assert len(words) > 10_000
    return frozenset(words)


def known_fraction(text: str, vocab) -> tuple[float, int]:
    ws = words_of(text)
    if not ws:
        return 0.0, 0
    return sum(w in vocab for w in ws) / len(ws), len(ws)


def check_texts(texts, vocab):
    report = []
    for prompt, text in zip(PROMPTS, texts):
        frac, n = known_fraction(text, vocab)
        report.append((prompt, round(frac, 3), n, len(set(words_of(text))), text))
    bad = [r for r in report if r[1] < MIN_FRACTION or r[2] < MIN_WORDS or r[3] < MIN_DISTINCT]
    assert not bad, "continuations with too few (known / distinct) words:\n" + "\n".join(map(repr, bad))


def hf_generate(model, tok, torch, sample=False):
    """All prompts in one left-padded batch."""
    tok.padding_side = "left"
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    kw = dict(do_sample=True, temperature=0.8, top_k=None) if sample else dict(do_sample=False)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS,
                             pad_token_id=tok.eos_token_id, **kw)
    return tok.batch_decode(out[:, enc.input_ids.shape[1]:], skip_special_tokens=True)


@pytest.fixture(scope="module")
def hf():
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ASSETS)
    model = AutoModelForCausalLM.from_pretrained(ASSETS, dtype=torch.float32).eval()
    return torch, tok, model


def test_assets_complete_and_small():
    names = {p.name for p in ASSETS.iterdir()}
    for need in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json", "special_tokens_map.json", "words.txt"):
        assert need in names, need
    assert sum(p.stat().st_size for p in ASSETS.iterdir()) < 20 * 2**20
    cfg = json.loads((ASSETS / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["tie_word_embeddings"]
    assert cfg["eos_token_id"] == json.loads((ASSETS / "generation_config.json").read_text())["eos_token_id"]


def test_metric_rejects_gibberish(vocab):
    # the threshold means something: letter salad and real words score far apart
    frac, _ = known_fraction("Thrumble vexquor, blindstrap ozzle! Farnock wib tarrowish glemp.", vocab)
    assert frac < 0.5
    frac, _ = known_fraction("Now is the winter of our discontent made glorious summer.", vocab)
    assert frac == 1.0


def test_transformers_greedy_text_is_shakespearean(vocab, hf):
    torch, tok, model = hf
    assert sum(p.numel() for p in model.parameters()) <= 8_000_000
    check_texts(hf_generate(model, tok, torch), vocab)


def test_transformers_sampled_text_is_shakespearean(vocab, hf):
    torch, tok, model = hf
    torch.manual_seed(0)
    words = [w for t in hf_generate(model, tok, torch, sample=True) for w in words_of(t)]
    assert len(words) >= MIN_WORDS * len(PROMPTS)
    assert sum(w in vocab for w in words) / len(words) >= SAMPLED_MIN_FRACTION


def test_check_fails_for_random_init_model(vocab, hf):
    # the same check on an untrained model of the same shape must fail
    torch, tok, model = hf
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    rand = LlamaForCausalLM(model.config).float().eval()
    with pytest.raises(AssertionError):
        check_texts(hf_generate(rand, tok, torch), vocab)


def test_engine_default_model_greedy_text_is_shakespearean(vocab):
    engine = pytest.importorskip("engine")
    LLM, SamplingParams = engine.LLM, engine.SamplingParams

    llm = LLM(model="default", device="cpu")
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True))
    texts = [o.outputs[0].text for o in outs]
    check_texts(texts, vocab)
