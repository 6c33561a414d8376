"""What a workload is made of: a `WorkItem` (one request to submit), the `WorkloadSpec`
(sizes and sampling shared by every item), a `Scenario` (index -> item) and the prompt
data behind text prompts.

Text models (pass `tokenizer`) read roseplay/workload/data/prompts.json
({"system_prompts": [...], "short": [...], "long": [...]}), or a small built-in set of
Shakespeare-like lines when that file is missing; models without a tokenizer (dummy:*
presets, `tokenizer=None`) get token-id prompts {"prompt_token_ids": [...]} with
vLLM-random-dataset lengths: input and output lengths uniform in [L*(1-r), L*(1+r)] for
`range_ratio` r. The scenarios themselves are in roseplay/workload/scenarios.py.
"""
from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from engine.request import SamplingParams

DATA_PATH = Path(__file__).resolve().parent / "data" / "prompts.json"

FALLBACK = {
    "system_prompts": [
        "You are a player in a company of actors. Answer in the manner of the old plays, "
        "in blank verse where you can, and keep to the scene.",
        "Thou art a learned clerk of the court at Verona. Speak plainly, briefly, and with "
        "courtesy to all who ask thee questions.",
        "You are the chorus. Before each act you tell the audience, in a few lines, what "
        "has passed and what is to come.",
    ],
    "short": [
        "What news from the court?", "Who comes here at this hour?",
        "Why dost thou weep, good sir?", "Where lies the king tonight?",
        "What say you to the duke?", "How fares the queen?",
        "Shall we to the tavern?", "Is the ship come in?",
        "What hour is it now?", "Who wrote this letter?",
        "Wherefore art thou sad?", "What is the matter, friend?",
    ],
    "long": [
        "Now is the season of our long discontent made bright by summer sun, and all the "
        "clouds that lowered upon our house are in the deep bosom of the ocean buried. "
        "Now are our brows bound with victorious wreaths, our bruised arms hung up for "
        "monuments, our stern alarums changed to merry meetings.",
        "The quality of kindness is not strained; it droppeth as the gentle rain from "
        "heaven upon the place beneath. It is twice blest: it blesseth him that gives and "
        "him that takes; it is mightiest in the mightiest.",
    ],
}

WORDS_FALLBACK = ("rose", "crown", "sword", "night", "king", "queen", "moon", "heart",
                  "love", "ghost", "storm", "sea", "gold", "bell", "star", "fool")


@dataclass(frozen=True)
class WorkItem:
    """One request to submit: `prompt` is text or {"prompt_token_ids": [...]}."""
    prompt: str | dict
    params: SamplingParams
    arrival: float | None = None     # offset (s) from the start; None: the driver decides
    tag: str = ""                    # e.g. "short" / "long" / "prefix-2"
    priority: int = 0                # scheduling_policy=priority: lower is served first

    @property
    def prompt_len_hint(self) -> int | None:
        """Token count for token-id prompts (None for text)."""
        if isinstance(self.prompt, dict):
            return len(self.prompt["prompt_token_ids"])
        return None


@dataclass
class WorkloadSpec:
    """Sizes and sampling shared by every item of a workload (documented defaults)."""
    tokenizer: object = None
    vocab_size: int = 512
    input_len: int = 64
    output_len: int = 32
    range_ratio: float = 0.0
    seed: int = 0
    temperature: float = 0.0
    ignore_eos: bool = True
    data: dict = field(default_factory=dict)
    words: tuple[str, ...] = WORDS_FALLBACK

    def rng(self, *key) -> random.Random:
        return random.Random(":".join(str(k) for k in (self.seed, *key)))

    def sample_len(self, rng: random.Random, length: int) -> int:
        lo = max(1, int(length * (1 - self.range_ratio)))
        hi = max(lo, int(length * (1 + self.range_ratio)))
        return rng.randint(lo, hi)

    def params(self, rng: random.Random) -> SamplingParams:
        return SamplingParams(max_tokens=self.sample_len(rng, self.output_len),
                              temperature=self.temperature, ignore_eos=self.ignore_eos)

    def token_ids(self, rng: random.Random, n: int) -> list[int]:
        return [rng.randrange(self.vocab_size) for _ in range(n)]


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    description: str
    make: Callable[[WorkloadSpec, int], WorkItem] = field(repr=False, compare=False)
    default_submit_interval: float | None = None   # seconds; the design-note arrival


def load_prompt_data(path: Path | str | None = None) -> dict:
    """prompts.json if present and well formed, else the built-in fallback."""
    path = Path(path) if path is not None else DATA_PATH
    try:
        data = json.loads(path.read_text())
        if all(isinstance(data.get(k), list) and data[k] for k in FALLBACK):
            return {k: [str(x) for x in data[k]] for k in FALLBACK}
    except (OSError, ValueError, AttributeError):
        pass
    return {k: list(v) for k, v in FALLBACK.items()}


def words_of(data: dict, tokenizer=None, limit: int = 3000) -> tuple[str, ...]:
    """Distinct words of the data; with a tokenizer, only words that are one token both
    alone and after a space (so "w w w ..." repeated k times is exactly k tokens)."""
    text = " ".join(s for v in data.values() for s in v)
    words = sorted({w.lower() for w in re.findall(r"[A-Za-z]{3,}", text)})[:limit]
    if tokenizer is not None:
        words = [w for w in words if len(tokenizer.encode(w)) == 1
                 and len(tokenizer.encode(" " + w)) == 1]
    return tuple(words) or WORDS_FALLBACK


def make_spec(*, tokenizer=None, vocab_size: int = 512, input_len: int = 64,
              output_len: int = 32, range_ratio: float = 0.0, seed: int = 0,
              temperature: float = 0.0, ignore_eos: bool = True,
              data: dict | None = None) -> WorkloadSpec:
    if input_len < 1 or output_len < 1:
        raise ValueError("input_len and output_len must be >= 1")
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError("range_ratio must be in [0, 1)")
    data = data if data is not None else load_prompt_data()
    return WorkloadSpec(tokenizer, vocab_size, input_len, output_len, range_ratio, seed,
                        temperature, ignore_eos, data, words_of(data, tokenizer))
