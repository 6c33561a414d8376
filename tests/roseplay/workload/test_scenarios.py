"""Scenarios, arrival processes, the WorkloadDriver and the generated engine flags (CPU)."""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time

import pytest

from roseplay.workload import items as it, scenarios as sc
from roseplay.cli_flags import add_engine_flags, engine_fields, engine_kwargs, parse_knob_value
from roseplay.workload.driver import WorkloadDriver, arrival_offsets

TOKEN_KW = dict(vocab_size=512, input_len=64, output_len=8)


class CharTokenizer:
    def encode(self, text):
        return [ord(c) % 256 for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def ids(item):
    return item.prompt["prompt_token_ids"]


# -- scenarios ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(sc.SCENARIOS))
def test_workloads_are_deterministic_and_seeded(name):
    a = sc.build_workload(name, 12, seed=3, **TOKEN_KW)
    b = sc.build_workload(name, 12, seed=3, **TOKEN_KW)
    assert a == b and len(a) == 12
    if name == "mixed":     # output lengths spread: requests do not finish in lockstep
        assert all(2 <= x.params.max_tokens <= 14 for x in a)
        assert len({x.params.max_tokens for x in a}) > 3
    else:
        assert [x.params.max_tokens for x in a] == [8] * 12
    assert all(x.params.ignore_eos and x.params.temperature == 0 for x in a)
    if name != "identical":
        assert a != sc.build_workload(name, 12, seed=4, **TOKEN_KW)


@pytest.mark.parametrize("name", list(sc.SCENARIOS))
def test_iter_workload_extends_build_workload(name):
    it = sc.iter_workload(name, **TOKEN_KW)
    first = [next(it) for _ in range(10)]
    assert first == sc.build_workload(name, 10, **TOKEN_KW)
    assert next(it) is not None        # endless


def test_identical_prompts_are_all_equal():
    items = sc.build_workload("identical", 16, vocab_size=512, input_len=65, output_len=2)
    assert all(x.prompt == items[0].prompt for x in items)
    assert len(ids(items[0])) == 65 and len(set(ids(items[0]))) == 1   # 65 repeats of one id
    text = sc.build_workload("identical", 4, tokenizer=CharTokenizer())
    assert len({x.prompt for x in text}) == 1
    assert text[0].prompt.split() == ["rose"] * 65


def test_long_short_cycles_1_1_1_64():
    items = sc.build_workload("long-short", 12, **TOKEN_KW)
    assert [len(ids(x)) for x in items] == [1, 1, 1, 64] * 3
    assert [x.tag for x in items[:4]] == ["short", "short", "short", "long"]
    long = ids(items[3])
    assert len(set(long)) == 1                                   # 64 repeats of one word
    assert ids(items[7])[0] != long[0] or ids(items[11])[0] != long[0]   # words differ
    text = sc.build_workload("long-short", 8, tokenizer=CharTokenizer())
    assert [len(x.prompt.split()) for x in text] == [1, 1, 1, 64] * 2
    assert sc.SCENARIOS["long-short"].default_submit_interval == 0.02


def test_long_short_unit_scales_with_input_len():
    items = sc.build_workload("long-short", 4, vocab_size=512, input_len=512, output_len=4)
    assert [len(ids(x)) for x in items] == [8, 8, 8, 512]


def test_shared_prefix_shares_openings_and_differs_after():
    items = sc.build_workload("shared-prefix", 16, **TOKEN_KW)
    plen = TOKEN_KW["input_len"] * 3 // 4
    prefixes = [tuple(ids(x)[:plen]) for x in items]
    assert len(set(prefixes)) == sc.NUM_PREFIXES
    assert prefixes[0] == prefixes[sc.NUM_PREFIXES] == prefixes[2 * sc.NUM_PREFIXES]
    assert len({tuple(ids(x)) for x in items}) == 16             # every prompt unique
    assert all(len(ids(x)) == TOKEN_KW["input_len"] for x in items)


def test_shared_prefix_text_uses_system_prompts(tmp_path):
    data = {"system_prompts": ["SYS-A says hello.", "SYS-B says hi."],
            "short": ["q1?", "q2?", "q3?"], "long": ["a long passage"]}
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps(data))
    loaded = it.load_prompt_data(path)
    assert loaded == data
    items = sc.build_workload("shared-prefix", 8, tokenizer=CharTokenizer(), data=loaded)
    assert sum(x.prompt.startswith("SYS-A") for x in items) == 4
    assert len({x.prompt for x in items}) == 8                   # questions made distinct


def test_missing_or_bad_prompt_data_falls_back(tmp_path):
    assert it.load_prompt_data(tmp_path / "nope.json") == it.FALLBACK
    bad = tmp_path / "bad.json"
    bad.write_text('{"short": []}')
    assert it.load_prompt_data(bad) == it.FALLBACK


def test_random_lengths_follow_range_ratio():
    items = sc.build_workload("random", 200, vocab_size=512, input_len=100, output_len=20,
                              range_ratio=0.5)
    ins = [len(ids(x)) for x in items]
    outs = [x.params.max_tokens for x in items]
    assert min(ins) >= 50 and max(ins) <= 150 and len(set(ins)) > 20
    assert min(outs) >= 10 and max(outs) <= 30
    assert all(0 <= t < 512 for x in items for t in ids(x))
    assert len({tuple(ids(x)) for x in items}) == 200
    fixed = sc.build_workload("random", 10, vocab_size=512, input_len=100, output_len=20)
    assert {len(ids(x)) for x in fixed} == {100}


def test_random_text_prompts_have_exact_token_length():
    items = sc.build_workload("random", 5, tokenizer=CharTokenizer(), input_len=40)
    assert all(len(x.prompt["prompt_token_ids"]) == 40 and x.prompt["prompt"] for x in items)


def test_bad_sizes_rejected():
    with pytest.raises(ValueError):
        sc.build_workload("random", 2, input_len=0)
    with pytest.raises(ValueError):
        sc.build_workload("random", 2, range_ratio=1.0)
    with pytest.raises(ValueError):
        sc.get_scenario("nope")


# -- arrivals ----------------------------------------------------------------------------
def test_arrival_offsets_interval_poisson_burst():
    assert arrival_offsets(5) == [0.0] * 5
    assert arrival_offsets(4, submit_interval=0.02) == pytest.approx([0, 0.02, 0.04, 0.06])
    pois = arrival_offsets(2000, request_rate=50.0, seed=1)
    assert len(pois) == 2000 and pois[0] == 0.0
    assert all(b >= a for a, b in zip(pois, pois[1:]))
    gaps = [b - a for a, b in zip(pois, pois[1:])]
    assert statistics.mean(gaps) == pytest.approx(1 / 50.0, rel=0.1)
    assert pois == arrival_offsets(2000, request_rate=50.0, seed=1)


def test_burstiness_shapes_the_gaps_of_a_rate():
    """vLLM's --burstiness: gamma gaps of shape B and mean 1/rate; 1 is the Poisson process
    (the same draws as without it), below 1 the gaps vary more (clumps), above 1 less. The
    squared coefficient of variation of a gamma is 1/B."""
    poisson = arrival_offsets(2000, request_rate=50.0, seed=1)
    assert arrival_offsets(2000, request_rate=50.0, burstiness=1.0, seed=1) == poisson

    def gaps(b):
        t = arrival_offsets(4000, request_rate=50.0, burstiness=b, seed=3)
        return [y - x for x, y in zip(t, t[1:])]

    for b in (0.25, 4.0):
        g = gaps(b)
        assert statistics.mean(g) == pytest.approx(1 / 50.0, rel=0.1)
        cv2 = statistics.pvariance(g) / statistics.mean(g) ** 2
        assert cv2 == pytest.approx(1 / b, rel=0.25), b
    assert arrival_offsets(3, submit_interval=0.5, burstiness=0.1) == [0, 0.5, 1.0]


# -- driver --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def loop():
    from engine.front.loop import EngineLoop
    lp = EngineLoop(model="dummy:tiny", num_blocks=128, max_num_seqs=16)
    yield lp
    lp.close()


def test_driver_concurrency_cap_never_exceeded(loop):
    d = WorkloadDriver(loop, "random", concurrency=3, num_requests=24,
                       workload=dict(TOKEN_KW, input_len=16)).start()
    assert d.wait(60)
    assert d.completed == 24 and d.failed == 0 and len(d.outputs) == 24
    assert d.max_in_flight == 3
    ids_ = sorted(d.submission_index(o.request_id) for o in d.outputs)
    assert ids_ == list(range(24))


def test_driver_burst_submits_everything_at_once(loop):
    d = WorkloadDriver(loop, "random", num_requests=10, workload=dict(TOKEN_KW, input_len=8)).start()
    assert d.wait(60) and d.max_in_flight == 10


def test_driver_interval_spaces_arrivals(loop):
    items = sc.build_workload("random", 6, vocab_size=512, input_len=8, output_len=2)
    d = WorkloadDriver(loop, items, submit_interval=0.03, num_requests=6).start()
    assert d.wait(60) and d.completed == 6
    arrivals = [o.metrics.arrival_time for o in
                sorted(d.outputs, key=lambda o: d.submission_index(o.request_id))]
    assert all(b > a for a, b in zip(arrivals, arrivals[1:]))
    assert arrivals[-1] - arrivals[0] >= 5 * 0.03 * 0.9


def test_driver_item_arrival_offsets(loop):
    base = sc.build_workload("random", 3, vocab_size=512, input_len=8, output_len=2)
    items = [it.WorkItem(x.prompt, x.params, arrival=0.05 * i) for i, x in enumerate(base)]
    d = WorkloadDriver(loop, items, num_requests=3).start()
    assert d.wait(60)
    arrivals = sorted(o.metrics.arrival_time for o in d.outputs)
    assert arrivals[2] - arrivals[0] >= 0.09


def test_driver_counts_invalid_requests_without_hanging(loop):
    too_long = it.WorkItem({"prompt_token_ids": [1] * 5000}, it.SamplingParams(max_tokens=2))
    ok = sc.build_workload("random", 2, vocab_size=512, input_len=8, output_len=2)
    d = WorkloadDriver(loop, [too_long] + ok, num_requests=3).start()
    assert d.wait(60)
    assert d.failed == 1 and d.completed == 2 and d.submit_errors


def wait_until(cond, timeout=20.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_driver_live_controls_endless(loop):
    d = WorkloadDriver(loop, "random", request_rate=200.0, concurrency=4,
                       workload=dict(TOKEN_KW, input_len=8, output_len=4)).start()
    assert wait_until(lambda: d.completed >= 3)
    d.pause()
    time.sleep(0.2)                     # at most one submission was under way
    n = d.submitted
    time.sleep(0.2)
    assert d.submitted == n and d.paused
    d.set_scenario("identical")
    d.set_concurrency(2)
    d.set_rate(submit_interval=0.01)
    d.resume()
    assert wait_until(lambda: d.submitted > n + 2)
    assert d.scenario_name == "identical"
    d.stop()
    assert d.finished and d.max_in_flight <= 4
    assert loop.wait_idle(30)
    with pytest.raises(ValueError):
        d.set_rate(request_rate=1.0, submit_interval=1.0)


# -- engine flags --------------------------------------------------------------------------
def test_engine_flags_generated_from_config():
    p = argparse.ArgumentParser()
    add_engine_flags(p)
    names = {f.name for f in engine_fields()}
    assert {"model", "max_num_batched_tokens", "enable_prefix_caching", "block_size"} <= names
    args = p.parse_args(["--model", "dummy:tiny", "--no-enable-prefix-caching",
                         "--max-num-batched-tokens", "224", "--dtype", "float32"])
    assert engine_kwargs(args) == {"model": "dummy:tiny", "enable_prefix_caching": False,
                                   "max_num_batched_tokens": 224, "dtype": "float32"}
    assert engine_kwargs(p.parse_args([])) == {}
    for bad in (["--max-num-seqs", "0"], ["--dtype", "int8"], ["--block-size", "x"]):
        with pytest.raises(SystemExit):
            p.parse_args(bad)
    help_text = p.format_help()
    assert "--enable-prefix-caching, --no-enable-prefix-caching" in help_text
    assert "Token budget of one forward" in help_text


def test_parse_knob_value():
    assert parse_knob_value("enable_prefix_caching", "off") is False
    assert parse_knob_value("max-num-batched-tokens", "8192") == 8192
    assert parse_knob_value("num_blocks", "none") is None
    with pytest.raises(ValueError):
        parse_knob_value("max_num_seqs", "0")
    with pytest.raises(ValueError):
        parse_knob_value("nope", "1")


def test_mixed_has_chat_turns_on_shared_prefixes_and_long_low_priority_documents():
    cycle = len(sc.MIXED_PATTERN)
    items = sc.build_workload("mixed", cycle * (sc.MIXED_LIBRARY + 1), seed=0, **TOKEN_KW)
    long = [x for x in items if x.tag == "long"]
    docs = [x for x in items if x.tag.startswith("doc-")]
    chat = [x for x in items if x.tag.startswith("prefix-")]
    assert len(long) + len(docs) + len(chat) == len(items)
    assert len(long) == sc.MIXED_PATTERN.count("l") * (sc.MIXED_LIBRARY + 1)
    assert all(x.priority == 1 for x in long + docs) and all(x.priority == 0 for x in chat)
    n = TOKEN_KW["input_len"]
    doc_len = sc.MIXED_LONG_SCALE * n
    assert all(len(ids(x)) == doc_len for x in long)
    assert len({tuple(ids(x)) for x in long}) == len(long)        # one-off documents
    assert all(len(ids(x)) <= n for x in chat)
    by_prefix = {}
    for x in chat:        # chat turns of one system prompt share its first tokens
        by_prefix.setdefault(x.tag, []).append(ids(x)[: n * 3 // 4])
    assert all(len({tuple(p) for p in group}) == 1 for group in by_prefix.values())
    # two questions at a time on one reference document, the library in turn: document k
    # comes back MIXED_LIBRARY cycles later (lru has evicted it by then, lfu keeps it)
    heads = [tuple(ids(x)[:doc_len]) for x in docs]
    assert all(len(ids(x)) > doc_len for x in docs)
    assert heads[0::2] == heads[1::2] and ids(docs[0]) != ids(docs[1])
    assert len(set(heads)) == sc.MIXED_LIBRARY and heads[-1] == heads[0]


def test_open_loop_arrivals_keep_each_items_priority():
    """With a rate the shared stream stamps arrivals on the items; the documents' priority
    1 must survive it (the priority policy orders the queue by it)."""
    from roseplay.workload.shared import SharedWorkload
    items = list(itertools.islice(SharedWorkload("mixed", rate=5.0, **TOKEN_KW).reader(), 8))
    assert all(x.arrival is not None for x in items)
    assert [x.priority for x in items] == [
        x.priority for x in sc.build_workload("mixed", 8, seed=0, **TOKEN_KW)]
    assert {x.priority for x in items} == {0, 1}


def test_multi_turn_resends_each_conversations_growing_history():
    """Turn t of a conversation starts with the whole prompt of its turn t - 1 (and that
    turn's reply), the conversations take turns, and one starts over after CHAT_TURNS."""
    chats, turns = sc.CHATS, sc.CHAT_TURNS
    items = sc.build_workload("multi-turn", 2 * chats * turns, **TOKEN_KW)
    for i in range(chats, chats * turns):
        prev, cur = ids(items[i - chats]), ids(items[i])
        assert cur[:len(prev)] == prev and len(cur) == len(prev) + 16 + 8   # user + reply
    firsts = [ids(items[c]) for c in range(chats)]
    assert len({tuple(p[:64]) for p in firsts}) == chats        # a system prompt each
    restart = ids(items[chats * turns])
    assert len(restart) == len(firsts[0]) and restart != firsts[0]
    text = sc.build_workload("multi-turn", chats + 1, tokenizer=CharTokenizer(),
                             data=it.load_prompt_data(), output_len=8)
    assert text[chats].prompt.startswith(text[0].prompt.removesuffix("ASSISTANT."))
