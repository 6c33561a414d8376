"""Speculative decoding with a draft model (method draft_model, docs/SPECULATIVE.md "Draft
model") on the default path: the engine in its own process (EngineClient), the bundled
Shakespeare model as target and the bundled draft (a random tiny Llama of the target's
vocabulary where the bundled draft is absent). Greedy output is identical to the
non-speculative engine's through chunked prefill, prefix hits, preemption and live
changes of k; the draft's own KV pool is empty after every run, after cancels too; the
official openai client gets the same text through `roseplay serve`'s app, and /metrics
counts the drafts. In-process: a draft equal to the target has every draft accepted (its
catch-up and rewind keep its KV exact), a failing draft ends no request, and the config
checks."""
import json
import logging
import os

import httpx
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from safetensors.torch import save_file

from engine import LLM, SamplingParams
from engine.config import (DEFAULT_DRAFT_MODEL, InvalidRequestError, SpeculativeConfig,
                           make_config)
from engine.core.draft_proposer import MAX_CONSECUTIVE_FAULTS, DraftBlockPool, DraftState
from engine.core.stats import engine_stats
from engine.front.client import EngineClient
from engine.tokenizer import DEFAULT_MODEL_DIR
from roseplay.serve.app import build_app
from roseplay.serve.metrics import spec_decode_metrics
from roseplay.serve.server import ServerThread

TIMEOUT = 120
LINE = "To be, or not to be, that is the question.\n"
SHARED = "ROMEO.\nBut soft, what light through yonder window breaks?\n" * 2
PROMPTS = ([LINE * 3, LINE * 3,                                     # dedup
            SHARED + "JULIET.\n", SHARED + "ROMEO.\n",             # prefix hits
            "First Citizen.\nBefore we proceed any further, hear me speak.\n" * 3,
            "KING.\nWhat news? " * 6]
           + [f"{LINE * 2}HAMLET {i}.\n" for i in range(3)])
# few blocks (preemption), a small budget (chunked prefill, drafts cut to it)
KW = dict(model="default", device="cpu", block_size=8, num_blocks=28,
          max_num_batched_tokens=48, max_num_seqs=8, check_invariants=True)
GREEDY = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
BUNDLED = os.path.exists(os.path.join(DEFAULT_DRAFT_MODEL, "model.safetensors"))


def write_random_llama(path, vocab_size: int, seed: int = 0) -> str:
    """A 2-layer Llama with random weights and the bundled model's config otherwise."""
    with open(DEFAULT_MODEL_DIR / "config.json") as f:
        cfg = json.load(f)
    h, inter, d = 64, 128, 16
    cfg.update(hidden_size=h, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, intermediate_size=inter, head_dim=d,
               vocab_size=vocab_size)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *shape: torch.randn(*shape, generator=g) * 0.02   # noqa: E731
    t = {"model.embed_tokens.weight": rnd(vocab_size, h), "model.norm.weight": torch.ones(h)}
    shapes = {"self_attn.q_proj": (4 * d, h), "self_attn.k_proj": (2 * d, h),
              "self_attn.v_proj": (2 * d, h), "self_attn.o_proj": (h, 4 * d),
              "mlp.gate_proj": (inter, h), "mlp.up_proj": (inter, h),
              "mlp.down_proj": (h, inter)}
    for layer in range(2):
        p = f"model.layers.{layer}."
        t.update({p + n + ".weight": rnd(*s) for n, s in shapes.items()})
        t[p + "input_layernorm.weight"] = torch.ones(h)
        t[p + "post_attention_layernorm.weight"] = torch.ones(h)
    save_file(t, os.path.join(path, "model.safetensors"))
    return str(path)


@pytest.fixture(scope="module")
def draft(tmp_path_factory):
    if BUNDLED:
        return DEFAULT_DRAFT_MODEL
    return write_random_llama(tmp_path_factory.mktemp("draft"), 4096)


@pytest.fixture(scope="module")
def spec(draft):
    """No model named: the bundled target's bundled draft (when it is there)."""
    named = {} if draft == DEFAULT_DRAFT_MODEL else {"model": draft}
    return {"method": "draft_model", "num_speculative_tokens": 4, **named}


SHORT = SamplingParams(max_tokens=24, temperature=0)


@pytest.fixture(scope="module")
def reference():
    """Without speculation: PROMPTS' tokens, then LINE * 3's text with SHORT."""
    with LLM(**KW) as llm:
        return ([list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY)],
                llm.generate([LINE * 3], SHORT)[0].outputs[0].text)


@pytest.fixture(scope="module")
def client(spec):
    c = EngineClient(label="draft-spec", snapshots=False, speculative_config=spec, **KW)
    yield c
    c.close()


def _run(client, k_changes=()):
    client.pause()
    streams = [client.submit(p, GREEDY) for p in PROMPTS]
    client.resume()
    for stream, k in zip(streams, k_changes):   # live: k changes while requests run
        stream.get(timeout=TIMEOUT)
        client.set_knobs(num_speculative_tokens=k)
    out = [list(s.result(timeout=TIMEOUT).outputs[0].token_ids) for s in streams]
    assert client.wait_idle(TIMEOUT)
    return out


def test_greedy_identical_and_draft_pool_empty_after(client, reference):
    before = client.engine_stats()
    assert _run(client) == reference[0]
    st = client.engine_stats()
    assert st.num_used_blocks == 0 and st.spec_draft_num_used_blocks == 0
    assert st.preemptions > before.preemptions, "the workload should preempt"
    assert st.prefix_hit_tokens > before.prefix_hit_tokens
    assert client.snapshot().counters.dedup_joined > 0
    drafts = st.spec_decode_num_draft_tokens - before.spec_decode_num_draft_tokens
    accepted = st.spec_decode_num_accepted_tokens - before.spec_decode_num_accepted_tokens
    assert drafts > 0 and 0 <= accepted <= drafts
    if BUNDLED:      # a trained draft agrees with the target often on Shakespeare
        assert accepted > 0.2 * drafts, (accepted, drafts)


def test_live_k_changes_keep_greedy_output(client, reference):
    assert _run(client, k_changes=(1, 0, 3)) == reference[0]
    st = client.engine_stats()
    assert st.num_used_blocks == 0 and st.spec_draft_num_used_blocks == 0
    client.set_knobs(num_speculative_tokens=4)


def test_cancelled_requests_return_their_draft_blocks(client):
    params = SamplingParams(max_tokens=180, temperature=0, ignore_eos=True)
    before = client.engine_stats().spec_decode_num_draft_tokens
    streams = [client.submit(f"HAMLET {i}.\n" + LINE, params) for i in range(3)]
    for s in streams:      # every request has started decoding
        s.get(timeout=TIMEOUT)
    for s in streams:
        client.cancel(s.request_id)
    reasons = [s.result(timeout=TIMEOUT).outputs[0].finish_reason for s in streams]
    assert set(reasons) <= {"cancelled", "length"} and "cancelled" in reasons, reasons
    assert client.wait_idle(TIMEOUT)
    st = client.engine_stats()
    assert st.spec_decode_num_draft_tokens > before
    assert st.num_used_blocks == 0 and st.spec_draft_num_used_blocks == 0


def test_openai_client_through_serve_and_metrics(client, reference):
    openai = pytest.importorskip("openai")   # the GPU machines' environment has none
    srv = ServerThread(build_app(client)).start()
    try:
        before = client.engine_stats().spec_decode_num_draft_tokens
        oa = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", timeout=TIMEOUT)
        got = oa.completions.create(model="default", prompt=LINE * 3,
                                    max_tokens=SHORT.max_tokens, temperature=0)
        assert client.wait_idle(TIMEOUT)
        metrics = httpx.get(srv.url + "/metrics", timeout=TIMEOUT).text
    finally:
        srv.stop()
    assert got.choices[0].text == reference[1]
    st = client.engine_stats()
    assert st.spec_decode_num_draft_tokens > before
    got = {s.name: s.value for fam in text_string_to_metric_families(metrics)
           for s in fam.samples if "position" not in s.labels}
    assert got["vllm:spec_decode_num_draft_tokens_total"] == st.spec_decode_num_draft_tokens
    assert got["vllm:spec_decode_num_drafts_total"] == st.spec_decode_num_drafts > 0


class FaultyDraft:
    """The executor's draft runner, whose every forward from call `at` (0-based) on
    raises: the draft's extends and decode chains, as a failing device would."""

    def __init__(self, runner, at: int):
        self.runner, self.at, self.calls = runner, at, 0

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def _call(self, forward, columns):
        self.calls += 1
        if self.calls > self.at:
            raise RuntimeError(f"injected draft fault at forward call {self.calls - 1}")
        return forward(columns)

    def extend(self, columns):
        return self._call(self.runner.extend, columns)

    def decode_chain(self, columns):
        return self._call(self.runner.decode_chain, columns)


def test_a_draft_fault_ends_no_request(spec, reference, caplog):
    """Every draft forward from the 5th on raises: the requests decode plainly with the
    same greedy tokens, the fault is logged once with its cause, and after
    MAX_CONSECUTIVE_FAULTS the draft is off, in the engine's stats and on /metrics."""
    with LLM(speculative_config=spec, **KW) as llm:
        proposer = llm.engine.spec.draft
        proposer.runner = FaultyDraft(proposer.runner, 4)
        with caplog.at_level(logging.ERROR, logger="engine.core.draft_proposer"):
            got = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY)]
        st = engine_stats(llm.engine, 0.0)
    assert got == reference[0]
    assert st.spec_draft_faults == MAX_CONSECUTIVE_FAULTS and st.spec_draft_disabled
    assert st.spec_decode_num_draft_tokens > 0          # drafts before the faults
    assert st.num_used_blocks == 0 and st.spec_draft_num_used_blocks == 0
    failed = [r for r in caplog.records if "draft model forward failed" in r.getMessage()]
    assert len(failed) == 1 and "injected draft fault" in str(failed[0].exc_info[1])
    assert any("turned off after 3 consecutive faults" in r.getMessage()
               for r in caplog.records)
    got = {s.name: s.value for fam in spec_decode_metrics([st], ["model_name"], [["default"]])
           for s in fam.samples}
    assert got["roseplay:spec_draft_faults_total"] == MAX_CONSECUTIVE_FAULTS
    assert got["roseplay:spec_draft_disabled"] == 1.0


def test_a_draft_equal_to_the_target_has_every_draft_accepted():
    """The draft's catch-up (an extend of what it has not seen) and rewind (its fed
    drafts kept where accepted) keep its KV exact: with the target itself as the draft,
    its greedy drafts are the target's greedy tokens."""
    spec = {"method": "draft", "model": str(DEFAULT_MODEL_DIR), "num_speculative_tokens": 3}
    # synchronous steps: async scheduling runs a request's first decodes without drafts
    # (engine/core/async_steps.py _may_chain), and this test counts every proposal
    with LLM(speculative_config=spec, async_scheduling=False, **KW) as llm:
        llm.generate(PROMPTS[:4], SamplingParams(max_tokens=24, temperature=0,
                                                 ignore_eos=True))
        c, proposer = llm.engine.counters, llm.engine.spec.draft
        assert c.spec_decode_num_draft_tokens > 30
        # float32 on CPU: the draft's extend and the target's verify agree but for a tie
        assert c.spec_decode_num_accepted_tokens >= 0.95 * c.spec_decode_num_draft_tokens
        assert proposer.pool.num_free == proposer.pool.num_blocks and not proposer.states
        # temperature > 0: the same drafts, verified by rejection sampling (one-hot q)
        before = c.spec_decode_num_drafts
        out = llm.generate(PROMPTS[:2], SamplingParams(max_tokens=16, temperature=0.8))
        assert [len(o.outputs[0].token_ids) for o in out] == [16, 16]
        assert c.spec_decode_num_drafts > before and not proposer.states


def test_draft_state_keeps_the_fed_drafts_the_target_accepted():
    """Rewind: the fed drafts equal to the request's tokens stay computed, up to the
    first that differs; the last token is always recomputed (it yields draft 1)."""
    state = DraftState(request=None, seen=4, fed=[7, 8])
    state.rewind([1, 2, 3, 4, 7, 9, 5])          # draft 7 accepted, 8 rejected
    assert (state.seen, state.fed) == (5, [])
    state = DraftState(request=None, seen=4, fed=[7, 8])
    state.rewind([1, 2, 3, 4, 7, 8, 6])          # both accepted, then the bonus token
    assert state.seen == 6
    state = DraftState(request=None, seen=4, fed=[7, 8])
    state.rewind([1, 2, 3, 4, 7])                # 7 is the last token: recomputed
    assert state.seen == 4
    pool = DraftBlockPool(4)
    assert pool.take(3) == [0, 1, 2] and pool.take(2) is None and pool.num_free == 1
    pool.give([0, 1, 2])
    assert pool.num_free == 4


def test_config_checks(draft, tmp_path):
    cfg = make_config(speculative_config={"method": "draft_model"})   # bundled target
    assert cfg.speculative_config.model == DEFAULT_DRAFT_MODEL
    assert SpeculativeConfig.parse('{"method": "draft"}').method == "draft_model"
    with pytest.raises(InvalidRequestError, match="needs a \"model\""):
        make_config(model="dummy:tiny", speculative_config={"method": "draft_model"})
    with pytest.raises(InvalidRequestError, match="tensor_parallel_size 1"):
        make_config(tensor_parallel_size=2, speculative_config={"method": "draft_model",
                                                                "model": draft})
    other = write_random_llama(tmp_path / "v128", 128)
    with pytest.raises(InvalidRequestError, match="vocab_size 128"):
        LLM(model="default", device="cpu", num_blocks=16,
            speculative_config={"method": "draft_model", "model": other})


def test_tui_flag_accepts_draft_model_and_lists_the_methods():
    """`roseplay --speculative-config ...`: checked before the app opens, as the engine
    checks it; --help names every method."""
    from roseplay.cli import build_parser, check_engine
    from roseplay.cli_flags import engine_kwargs
    parser = build_parser()
    args = parser.parse_args(["--speculative-config", '{"method": "draft_model"}'])
    assert check_engine(args) is None
    assert engine_kwargs(args)["speculative_config"] == '{"method": "draft_model"}'
    bad = parser.parse_args(["--model", "dummy:tiny", "--speculative-config",
                             '{"method": "draft"}'])
    assert "needs a \"model\"" in check_engine(bad)
    text = " ".join(parser.format_help().split())
    assert all(m in text for m in ("ngram", "draft_model")) and "oracle" not in text


@pytest.mark.gpu
def test_draft_model_on_cuda_keeps_float32_greedy_output():
    """GPU (float32, so no bf16 near-tie flips): the target's graphs verify the drafts of
    the draft's captured decode chains; greedy tokens as without speculation, the draft
    pool empty."""
    kw = dict(model="default", device="cuda", dtype="float32")
    params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
    with LLM(**kw) as llm:
        want = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, params)]
    with LLM(speculative_config={"method": "draft_model", "num_speculative_tokens": 3},
             **kw) as llm:
        got = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, params)]
        c, proposer = llm.engine.counters, llm.engine.spec.draft
        chains = proposer.runner.chains
        assert got == want
        assert chains.graphs and chains.replays > 0 and chains.eager_chains == 0
        assert c.spec_decode_num_accepted_tokens > 0.2 * c.spec_decode_num_draft_tokens > 0
        assert proposer.pool.num_free == proposer.pool.num_blocks and not proposer.states
