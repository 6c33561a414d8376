"""Workload scenarios shared by the TUI and `roseplay bench`.

A scenario turns an index i into a `WorkItem` (roseplay/workload/items.py: prompt +
SamplingParams), the same item for the same (scenario, i, seed, sizes) every time:
`build_workload` makes a finite list (bench), `iter_workload` an endless generator (TUI).

Scenarios (see SCENARIOS): mixed, shared-prefix, long-short, identical, random, hot-scan,
repetitive, manuals, hot-prefix, multi-turn.
"""
from __future__ import annotations

import itertools
import random
from typing import Iterator

from engine.request import SamplingParams
from roseplay.workload.items import Scenario, WorkItem, WorkloadSpec, make_spec

# -- scenario builders ------------------------------------------------------------------
NUM_PREFIXES = 4
LONG_EVERY = 4          # long-short: items 3, 7, 11, ... are long (1, 1, 1, 64 pattern)
LONG_REPEATS = 64
IDENTICAL_REPEATS = 65  # 65 one-token words: 4 full blocks of 16 + a shared, partly filled 5th


def _shared_prefix(spec: WorkloadSpec, i: int) -> WorkItem:
    rng = spec.rng("shared-prefix", i)
    k = i % NUM_PREFIXES
    if spec.tokenizer is not None:
        systems, questions = spec.data["system_prompts"], spec.data["short"]
        q = questions[i % len(questions)]
        if i >= len(questions):
            q = f"{q} (asked again, {i // len(questions)})"
        prompt = f"{systems[k % len(systems)]}\n\n{q}"
    else:
        prefix_len = max(1, spec.input_len * 3 // 4)
        prefix = spec.token_ids(spec.rng("prefix", k), prefix_len)
        suffix_len = max(1, spec.sample_len(rng, spec.input_len) - prefix_len)
        prompt = {"prompt_token_ids": prefix + spec.token_ids(rng, suffix_len)}
    return WorkItem(prompt, spec.params(rng), tag=f"prefix-{k}")


def _repeat_unit(spec: WorkloadSpec, i: int) -> str | list[int]:
    """A per-request 'word' (so long prompts do not share a cached prefix)."""
    rng = spec.rng("word", i)
    if spec.tokenizer is not None:
        return rng.choice(spec.words)
    return spec.token_ids(rng, max(1, round(spec.input_len / LONG_REPEATS)))


def _repeat(unit, n: int) -> str | dict:
    if isinstance(unit, str):
        return " ".join([unit] * n)
    return {"prompt_token_ids": unit * n}


def _long_short(spec: WorkloadSpec, i: int) -> WorkItem:
    long = i % LONG_EVERY == LONG_EVERY - 1
    prompt = _repeat(_repeat_unit(spec, i), LONG_REPEATS if long else 1)
    return WorkItem(prompt, spec.params(spec.rng("long-short", i)), tag="long" if long else "short")


def _identical(spec: WorkloadSpec, i: int) -> WorkItem:
    if spec.tokenizer is not None:
        word = "rose" if "rose" in spec.words else spec.words[0]
        prompt = _repeat(word, IDENTICAL_REPEATS)
    else:
        prompt = {"prompt_token_ids": [spec.rng("identical").randrange(spec.vocab_size)]
                  * spec.input_len}
    return WorkItem(prompt, spec.params(spec.rng("identical")), tag="identical")


def _random(spec: WorkloadSpec, i: int, scale: int = 1, tag: str = "random") -> WorkItem:
    rng = spec.rng(tag, i)
    n = spec.sample_len(rng, scale * spec.input_len)
    if spec.tokenizer is None:
        return WorkItem({"prompt_token_ids": spec.token_ids(rng, n)}, spec.params(rng), tag=tag)
    words = spec.words
    text = " ".join(rng.choice(words) for _ in range(n))
    ids = list(spec.tokenizer.encode(text))[:n]
    prompt = {"prompt_token_ids": ids, "prompt": spec.tokenizer.decode(ids)}
    return WorkItem(prompt, spec.params(rng), tag=tag)


HOT_RUN, SCAN_RUN, SCAN_SCALE = 2, 4, 4   # hot-scan: 2 requests on the hot prompt, then 4
#                                           one-off prompts of 4x input_len, again and again


def _hot_scan(spec: WorkloadSpec, i: int) -> WorkItem:
    """Recency against frequency: a hot system prompt asked twice, then a scan of long
    one-off prompts no one asks again. On a pool the scan overflows, lru evicts the hot
    prompt's blocks (released before the scan's) and its next first request misses; lfu
    keeps them (they have hits, the scan's have none), so every hot request hits."""
    if i % (HOT_RUN + SCAN_RUN) >= HOT_RUN:
        return _random(spec, i, scale=SCAN_SCALE, tag="scan")
    rng = spec.rng("hot", i)
    if spec.tokenizer is not None:
        q = spec.data["short"][i % len(spec.data["short"])]
        prompt = f"{spec.data['system_prompts'][0]}\n\n{q} ({i})"
    else:        # a hot prefix of 2x input_len tokens, and a short distinct question
        hot = spec.token_ids(spec.rng("hot-prefix"), 2 * spec.input_len)
        prompt = {"prompt_token_ids": hot + spec.token_ids(rng, 8)}
    return WorkItem(prompt, spec.params(rng), tag="hot")


MIXED_LONG_SCALE = 4        # mixed: a document is 4x input_len tokens
MIXED_PATTERN = "sssddssl"  # mixed: s = chat on a shared system prompt, d d = two questions
#                             on one reference document, l = a long one-off document
MIXED_LIBRARY = 8           # mixed: reference documents, asked about in turn


def _reference(spec: WorkloadSpec, k: int, i: int, rng: random.Random,
               scale: int = MIXED_LONG_SCALE, tag: str = "reference") -> dict:
    """Reference document k and question i: the document's blocks are the shared prefix."""
    doc = _random(spec, k, scale=scale, tag=tag).prompt["prompt_token_ids"]
    if spec.tokenizer is None:
        return {"prompt_token_ids": doc + spec.token_ids(rng, 8)}
    q = spec.data["short"][i % len(spec.data["short"])]
    ids = doc + list(spec.tokenizer.encode(f"\n\n{q}"))
    return {"prompt_token_ids": ids, "prompt": spec.tokenizer.decode(ids)}


def mixed_output_range(output_len: int) -> tuple[int, int]:
    """mixed: max_tokens runs from 1/4 to 7/4 of output_len."""
    return max(1, output_len // 4), max(1, output_len * 7 // 4)


def max_output_tokens(name: str, output_len: int, range_ratio: float = 0.0) -> int:
    """The largest max_tokens scenario `name` gives any request."""
    if name == "mixed":
        return mixed_output_range(output_len)[1]
    lo = max(1, int(output_len * (1 - range_ratio)))
    return max(lo, int(output_len * (1 + range_ratio)))


def _mixed(spec: WorkloadSpec, i: int) -> WorkItem:
    """Chat turns on shared system prompts (priority 0); documents (priority 1): pairs
    of questions on one of MIXED_LIBRARY reference documents, and long one-off ones.
    Output lengths run from 1/4 to 7/4 of output_len, so requests start and finish at
    their own times; long prompts chunk; a queue ordered by priority lets the chat turns
    go first. Each reference document comes back after the one-off documents and
    answers have filled the cache: lru has evicted it by then (the pair's first
    question misses), lfu keeps it (its blocks have a hit, the one-off ones none)."""
    rng = spec.rng("mixed", i)
    out = SamplingParams(max_tokens=rng.randint(*mixed_output_range(spec.output_len)),
                         temperature=spec.temperature, ignore_eos=spec.ignore_eos)
    kind = MIXED_PATTERN[i % len(MIXED_PATTERN)]
    if kind == "d":
        k = (i // len(MIXED_PATTERN)) % MIXED_LIBRARY
        return WorkItem(_reference(spec, k, i, rng), out, tag=f"doc-{k}", priority=1)
    if kind == "l":
        item = _random(spec, i, scale=MIXED_LONG_SCALE, tag="long")
        return WorkItem(item.prompt, out, tag="long", priority=1)
    item = _shared_prefix(spec, i)
    return WorkItem(item.prompt, out, tag=item.tag, priority=0)


MANUALS, MANUAL_SCALE = 31, 5   # manuals: 31 documents of 5x input_len tokens (an odd
#                                 count: round robin gives each replica every manual)
HOT_EVERY = 8                   # hot-prefix: 7 of every 8 requests on one hot prompt


def _manuals(spec: WorkloadSpec, i: int) -> WorkItem:
    """Manual i % MANUALS and a distinct question on it, the manuals in turn: together
    more than one replica's pool caches, half of them fit."""
    k, rng = i % MANUALS, spec.rng("manuals", i)
    prompt = _reference(spec, k, i, rng, scale=MANUAL_SCALE, tag="manual")
    return WorkItem(prompt, spec.params(rng), tag=f"manual-{k}")


def _hot_prefix(spec: WorkloadSpec, i: int) -> WorkItem:
    """Skew: HOT_EVERY - 1 of every HOT_EVERY requests ask about one hot document (2x
    input_len tokens); the rest are one-off prompts."""
    rng = spec.rng("hot-prefix", i)
    if i % HOT_EVERY == HOT_EVERY - 1:
        return _random(spec, i, tag="cold")
    prompt = _reference(spec, 0, i, rng, scale=2, tag="hot-doc")
    return WorkItem(prompt, spec.params(rng), tag="hot")


# repetitive: openings of roseplay/workload/data/prompts.json "short" on which the bundled model's
# greedy continuation falls into a loop within 64 tokens ("ANGELO.\nI am sorry for your
# pains.\n\nANGELO.\nI am sorry for your pains..."): n-gram drafts (prompt lookup) find
# the loop, mean accepted length 3.4-4.0 of 4 at k = 3 (2026-11-25, docs/SPECULATIVE.md)
REPETITIVE_PROMPTS = (
    "ANTONIO.\nBelieve me, no; I thank my fortune for it,\n",
    "CASSIUS.\nI have as much of this in art as you,\n",
    "ANGELO.\nYou make my bonds still greater.\n",
    "BOULT.\nAy, to eleven; and brought them down again. But shall I search\n",
    "ARMADO.\nWe will have, if this fadge not, an antic. I beseech you,\n",
    "SHALLOW.\nSir Hugh, persuade me not; I will make a Star Chamber matter\n",
    "SATURNINUS.\nNo, Titus, no; the emperor needs her not,\n",
    "NURSE.\nI mean, she's brought a-bed.\n",
)
REPETITIVE_UNIT = 8     # token ids: a unit of 8 random ids repeated to input_len


def _repetitive(spec: WorkloadSpec, i: int) -> WorkItem:
    """Greedy whatever the workload's temperature: the loop is the greedy continuation's
    (sampled at 0.8 the bundled model's text repeats far less, and drafts miss)."""
    rng = spec.rng("repetitive", i)
    params = SamplingParams(max_tokens=spec.sample_len(rng, spec.output_len),
                            temperature=0.0, ignore_eos=spec.ignore_eos)
    if spec.tokenizer is not None:
        return WorkItem(REPETITIVE_PROMPTS[i % len(REPETITIVE_PROMPTS)], params,
                        tag="repetitive")
    unit = spec.token_ids(rng, REPETITIVE_UNIT)
    reps = max(1, spec.input_len // REPETITIVE_UNIT)
    return WorkItem({"prompt_token_ids": unit * reps}, params, tag="repetitive")


CHATS, CHAT_TURNS = 8, 8    # multi-turn: conversations at a time, turns of each


def _chat_turn(spec: WorkloadSpec, chat: tuple, turn: int) -> tuple:
    """(user, reply) of one turn: token ids (the user input_len / 4 tokens), or a short
    question of the data; the reply output_len tokens (text: one-token words), what an
    answer of max_tokens adds to the history."""
    rng = spec.rng("chat", *chat, turn)
    if spec.tokenizer is None:
        return (spec.token_ids(rng, max(1, spec.input_len // 4)),
                spec.token_ids(rng, spec.output_len))
    short = spec.data["short"]
    return (short[rng.randrange(len(short))],
            " ".join(rng.choice(spec.words) for _ in range(spec.output_len)))


def _multi_turn(spec: WorkloadSpec, i: int) -> WorkItem:
    """Turn t of one of CHATS conversations, in turn: the system prompt, every earlier
    turn (the user's words and a reply) and the new user turn, so each turn re-sends the
    history the previous one sent and adds to it. The other conversations' turns come
    between two of one conversation's (its think time); after CHAT_TURNS turns a
    conversation starts over as a new one. The replies in the history are the scenario's
    own (fixed) text, not what the model answered: a run re-sends the same tokens."""
    c, t, epoch = i % CHATS, (i // CHATS) % CHAT_TURNS, i // (CHATS * CHAT_TURNS)
    chat = (epoch, c)
    turns = [_chat_turn(spec, chat, k) for k in range(t + 1)]
    params = spec.params(spec.rng("chat-params", i))
    if spec.tokenizer is None:
        ids = spec.token_ids(spec.rng("chat-system", *chat), spec.input_len)
        for k, (user, reply) in enumerate(turns):
            ids += user + (reply if k < t else [])
        return WorkItem({"prompt_token_ids": ids}, params, tag=f"chat-{c}:{t}")
    system = spec.data["system_prompts"][(epoch * CHATS + c) % len(spec.data["system_prompts"])]
    lines = [system]
    for k, (user, reply) in enumerate(turns):
        lines.append(f"USER. {user}")
        if k < t:
            lines.append(f"ASSISTANT. {reply}")
    return WorkItem("\n\n".join(lines) + "\n\nASSISTANT.", params, tag=f"chat-{c}:{t}")


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("mixed", "Chat + documents",
             f"Chat turns on {NUM_PREFIXES} shared system prompts (priority 0) mixed with "
             f"documents ({MIXED_LONG_SCALE}x input_len, priority 1): two questions at a "
             f"time on one of {MIXED_LIBRARY} reference documents, and one-off long ones. "
             "Output lengths spread over 1/4 to 7/4 of output_len: every headline knob "
             "(prefix cache, budget, scheduling mode and policy, eviction) changes something.",
             _mixed),
    Scenario("shared-prefix", "Shared system prompts",
             f"{NUM_PREFIXES} shared system-prompt openings + distinct short questions: "
             "the prefix cache serves the shared blocks.", _shared_prefix),
    Scenario("long-short", "Long/short mix",
             f"Prompts cycle 1,1,1,{LONG_REPEATS} repeats of a word (a different word per "
             "request, so no prefix sharing), one every 20 ms: a small token budget "
             "(chunked prefill) protects decode ITL.", _long_short,
             default_submit_interval=0.02),
    Scenario("identical", "Identical burst",
             "The same prompt many times (text: 65 repeats of a one-token word; token ids: "
             "input_len copies of one id): dedup prefills it once and every decode "
             "copies the shared, partly filled last block (copy-on-write).", _identical),
    Scenario("random", "Random unique prompts",
             "Unique random prompts of input_len +- range_ratio tokens (vLLM's random "
             "dataset): no sharing at all.", _random),
    Scenario("hot-scan", "Hot prompt + scans",
             f"{HOT_RUN} requests on one hot system prompt, then {SCAN_RUN} long one-off "
             f"prompts ({SCAN_SCALE}x input_len), repeated: on a small pool lru evicts the "
             "hot prompt during each scan, lfu keeps it (compare eviction_policy).", _hot_scan),
    Scenario("repetitive", "Repetitive text",
             f"{len(REPETITIVE_PROMPTS)} Shakespeare openings whose greedy continuation "
             "the bundled model repeats in a loop (greedy whatever the temperature; token "
             f"ids: a unit of {REPETITIVE_UNIT} ids repeated): n-gram speculative decoding "
             "finds the loop and a verify keeps most drafts (guide d).", _repetitive),
    Scenario("manuals", "Many manuals, across replicas",
             f"{MANUALS} manuals ({MANUAL_SCALE}x input_len tokens) asked about in turn, "
             "each question distinct: more shared prefixes than one pool caches. With "
             "--data-parallel-size 2, round robin sends every manual to both replicas and "
             "each pool evicts them before they come back; cache_aware keeps each manual "
             "on the replica that holds it (guide a).", _manuals),
    Scenario("hot-prefix", "One hot document (skew)",
             f"{HOT_EVERY - 1} of every {HOT_EVERY} requests ask about one hot document "
             "(2x input_len tokens), the rest are one-off: consistent_hash pins the hot "
             "prefix to one replica, whose queue grows while the other idles (guide b).",
             _hot_prefix),
    Scenario("multi-turn", "Multi-turn chat",
             f"{CHATS} conversations taking turns, {CHAT_TURNS} turns each: every turn "
             "re-sends the whole history (system prompt, earlier questions and replies) "
             "plus a new question, so the working set grows; on a small pool the history "
             "is evicted between turns, and the host tier (--kv-offloading-size) brings it "
             "back instead of recomputing it.", _multi_turn),
)}


def get_scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; choose from {', '.join(SCENARIOS)}") from None


def iter_workload(name: str, start: int = 0, **spec_kwargs) -> Iterator[WorkItem]:
    """Endless items of scenario `name` (for the TUI); keywords as `make_spec`."""
    scenario, spec = get_scenario(name), make_spec(**spec_kwargs)
    for i in itertools.count(start):
        yield scenario.make(spec, i)


def build_workload(name: str, n: int, **spec_kwargs) -> list[WorkItem]:
    """The first n items of scenario `name` (deterministic for a given seed)."""
    return list(itertools.islice(iter_workload(name, **spec_kwargs), n))
