"""Speculative decoding (docs/SPECULATIVE.md) on the default path: the engine in its own
process (EngineClient), n-gram drafts on the bundled Shakespeare model. Greedy output is
identical to the non-speculative engine's (the in-process LLM, the comparison) through
chunked prefill, prefix hits, dedup, copy-on-write, preemption, async scheduling and a
live toggle of the knob; the pool ends empty with every block-pool invariant checked
after each step; drafts are accepted on repetitive text and counted on /metrics. The
rejection sampler keeps the target distribution (a statistical test against a per-row
torch reference). Rollback: blocks of rejected slots go back, nothing unverified is hashed."""

from types import SimpleNamespace

import httpx
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.oracle import OracleProposer
from engine import LLM, SamplingParams
from engine.codes import EV_SPEC_VERIFY
from engine.config import InvalidRequestError, SpeculativeConfig, make_config
from engine.core.ngram_proposer import propose_ngram
from engine.core.spec_decode import _until_end
from engine.front.client import EngineClient
from engine.worker.rejection import rejection_sample
from roseplay.serve.app import build_app
from roseplay.serve.server import ServerThread

TIMEOUT = 120
LINE = "To be, or not to be, that is the question.\n"
SHARED = "ROMEO.\nBut soft, what light through yonder window breaks?\n" * 2
PROMPTS = ([LINE * 3, LINE * 3,                          # dedup (and COW of the last block)
            SHARED + "JULIET.\n", SHARED + "ROMEO.\n",   # prefix hits
            "First Citizen.\nBefore we proceed any further, hear me speak.\n" * 3,
            "KING.\nWhat news? " * 6]
           + [f"{LINE * 2}HAMLET {i}.\n" for i in range(4)])
# few blocks (preemption), a small budget (chunked prefill, drafts trimmed to it)
KW = dict(model="default", device="cpu", block_size=8, num_blocks=28,
          max_num_batched_tokens=48, max_num_seqs=8, check_invariants=True)
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
        "prompt_lookup_max": 3}
GREEDY = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def reference():
    with LLM(**KW) as llm:
        return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY)]


@pytest.fixture(scope="module")
def client():
    c = EngineClient(label="spec", snapshots=False, speculative_config=SPEC, **KW)
    yield c
    c.close()


def _run(client, toggle=False):
    client.pause()          # all queued before the first step: the twins dedup
    streams = [client.submit(p, GREEDY) for p in PROMPTS]
    client.resume()
    if toggle:      # live: off then on again while the requests run
        streams[0].get(timeout=TIMEOUT)
        client.set_knobs(num_speculative_tokens=0)
        streams[1].get(timeout=TIMEOUT)
        client.set_knobs(num_speculative_tokens=2)
    out = [list(s.result(timeout=TIMEOUT).outputs[0].token_ids) for s in streams]
    assert client.wait_idle(TIMEOUT)
    return out


def test_greedy_identical_with_speculation_and_pool_empty_after(client, reference):
    before = client.engine_stats()
    assert _run(client) == reference
    st = client.engine_stats()
    assert st.num_used_blocks == 0
    assert st.preemptions > before.preemptions, "the workload should preempt"
    assert st.prefix_hit_tokens > before.prefix_hit_tokens
    counters = client.snapshot().counters      # the one wait_idle took
    assert counters.dedup_joined > 0 and counters.cow_copies > 0
    drafts = st.spec_decode_num_draft_tokens - before.spec_decode_num_draft_tokens
    accepted = st.spec_decode_num_accepted_tokens - before.spec_decode_num_accepted_tokens
    assert drafts > 0 and accepted > 0, (drafts, accepted)
    assert accepted <= drafts
    per_pos = st.spec_decode_num_accepted_tokens_per_pos
    assert sum(per_pos) == st.spec_decode_num_accepted_tokens
    assert all(a >= b for a, b in zip(per_pos, per_pos[1:]))   # position i needs i-1 first


def test_live_toggle_keeps_greedy_output(client, reference):
    assert _run(client, toggle=True) == reference
    assert client.engine_stats().num_used_blocks == 0
    client.set_knobs(num_speculative_tokens=4)


def test_metrics_show_spec_decode_counters(client):
    srv = ServerThread(build_app(client)).start()
    try:
        r = httpx.post(srv.url + "/v1/completions", timeout=TIMEOUT, json={
            "model": "default", "prompt": LINE * 3, "max_tokens": 24, "temperature": 0})
        assert r.status_code == 200
        assert client.wait_idle(TIMEOUT)
        text = httpx.get(srv.url + "/metrics", timeout=TIMEOUT).text
    finally:
        srv.stop()
    got = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + (f"[{s.labels['position']}]" if "position" in s.labels else "")
            got[key] = s.value
    st = client.engine_stats()
    assert got["vllm:spec_decode_num_drafts_total"] == st.spec_decode_num_drafts > 0
    assert got["vllm:spec_decode_num_draft_tokens_total"] == st.spec_decode_num_draft_tokens
    assert got["vllm:spec_decode_num_accepted_tokens_total"] == \
        st.spec_decode_num_accepted_tokens > 0
    assert got["vllm:spec_decode_num_accepted_tokens_per_pos_total[0]"] == \
        st.spec_decode_num_accepted_tokens_per_pos[0]


def test_rollback_frees_rejected_slots_and_hashes_only_verified_tokens():
    """In-process (to look inside): after every verification the request holds exactly
    the blocks of its computed tokens and hashes only full computed blocks."""
    with LLM(speculative_config=SPEC, **KW) as llm:
        spec, seen = llm.engine.spec, []
        commit = spec.commit

        def checked(plan, tokens, *args):
            ended = commit(plan, tokens, *args)
            for c in plan.verifies:
                r = c.request
                if r.block_table:
                    bs = KW["block_size"]
                    assert len(r.block_table) == -(-r.num_computed_tokens // bs)
                    assert len(r.block_hashes) == r.num_computed_tokens // bs
                    seen.append(r.num_computed_tokens - c.start < c.num_tokens)
            return ended
        spec.commit = checked
        llm.generate(PROMPTS[:6], SamplingParams(max_tokens=30, temperature=0.8, seed=None))
        assert any(seen), "no draft was rejected"
        assert llm.engine.pool.num_used == 0
        verified = [e for e in llm.engine.events.recent() if e.kind == EV_SPEC_VERIFY]
        assert verified and all("drafted" in e.detail for e in verified)   # the TUI's log


def test_random_sampling_speculates_plain_and_seeded_requests():
    """temperature > 0: rejection sampling, seeded requests too (their rows draw from
    their own generator: the same seed gives the same tokens, whatever ran before);
    penalties or logprobs (the processed path): no drafts."""
    with LLM(speculative_config=SPEC, **KW) as llm:
        c = llm.engine.counters
        llm.generate([LINE * 3], SamplingParams(max_tokens=20, temperature=0.7, seed=5,
                                                presence_penalty=0.5, logprobs=1))
        assert c.spec_decode_num_drafts == 0
        out = llm.generate([LINE * 3], SamplingParams(max_tokens=20, temperature=0.7))
        assert len(out[0].outputs[0].token_ids) == 20
        assert c.spec_decode_num_drafts > 0
        seeded = SamplingParams(max_tokens=30, temperature=0.8, seed=11)
        drafts = c.spec_decode_num_draft_tokens
        runs = [llm.generate([LINE * 3], seeded)[0].outputs[0].token_ids for _ in range(2)]
        llm.generate([LINE * 3], SamplingParams(max_tokens=9, temperature=1.0))  # global draws
        runs.append(llm.generate([LINE * 3], seeded)[0].outputs[0].token_ids)
        assert c.spec_decode_num_draft_tokens > drafts
        assert runs[0] == runs[1] == runs[2] and len(runs[0]) == 30


def _reference_rejection(p, q, x, gen):
    """One position, row by row (the textbook algorithm)."""
    out = []
    for i in range(p.shape[0]):
        if torch.rand((), generator=gen) < min(1.0, float(p[i, x[i]] / q[i, x[i]])):
            out.append(int(x[i]))
        else:
            r = (p[i] - q[i]).clamp_min(0)
            out.append(int(torch.multinomial(r / r.sum(), 1, generator=gen)))
    return torch.tensor(out)


@pytest.mark.parametrize("one_hot", [True, False])
def test_rejection_sampler_preserves_the_target_distribution(one_hot):
    gen = torch.Generator().manual_seed(0)
    vocab, n = 6, 40000
    p = torch.softmax(torch.randn(vocab, generator=gen) * 1.5, 0)
    q = torch.softmax(torch.randn(vocab, generator=gen) * 1.5, 0)
    x = torch.multinomial(q, n, replacement=True, generator=gen)
    qs = None if one_hot else q.expand(n, vocab)
    out = rejection_sample(p.expand(n, vocab).clone(), x, qs, gen)
    emp = torch.bincount(out, minlength=vocab).double() / n
    assert 0.5 * (emp - p).abs().sum() < 0.015          # TV: ~0.005 expected at n = 40000
    accepted = (out == x).double().mean()
    want = p[x].mean() if one_hot else torch.minimum(p, q).sum()
    assert abs(accepted - want) < 0.015
    if not one_hot:           # the per-row reference draws the same distribution
        ref = _reference_rejection(p.expand(4000, vocab), q.expand(4000, vocab), x[:4000], gen)
        emp_ref = torch.bincount(ref, minlength=vocab).double() / 4000
        assert 0.5 * (emp_ref - p).abs().sum() < 0.05
    bonus = rejection_sample(p.expand(n, vocab).clone(), torch.full((n,), -1), None, gen)
    assert 0.5 * (torch.bincount(bonus, minlength=vocab).double() / n - p).abs().sum() < 0.015


def test_ngram_proposer_takes_the_longest_recent_match():
    assert propose_ngram([1, 2, 3, 9, 1, 2, 3, 4, 5, 1, 2, 3], 2, 1, 3) == [4, 5]
    assert propose_ngram([7, 8, 9], 3, 1, 3) == []
    assert propose_ngram([1, 2, 1], 3, 2, 3) == []          # no 2-gram recurs
    assert propose_ngram([5, 1, 6, 1], 2, 1, 3) == [6, 1]


def test_config_vllm_json_and_live_knob():
    cfg = make_config(speculative_config='{"method": "ngram", "num_speculative_tokens": 5, '
                                         '"prompt_lookup_max": 4, "prompt_lookup_min": 2}')
    assert cfg.speculative_config == SpeculativeConfig("ngram", 2, 4)
    assert cfg.scheduler.num_speculative_tokens == 5       # on from the start: k's one home
    assert not hasattr(cfg.speculative_config, "num_speculative_tokens")
    assert make_config(speculative_config={"method": "ngram"}).scheduler \
        .num_speculative_tokens == 3                        # vLLM's JSON without k
    assert make_config(speculative_config={"num_speculative_tokens": 5},
                       num_speculative_tokens=2).scheduler.num_speculative_tokens == 2
    assert make_config().scheduler.num_speculative_tokens == 0   # off by default
    for bad in ('{"method": "eagle"}', '{"num_speculative_tokens": 0}', "not json",
                '{"prompt_lookup_min": 4, "prompt_lookup_max": 2}', '{"k": 1}'):
        with pytest.raises(InvalidRequestError):
            make_config(speculative_config=bad)
    with pytest.raises(InvalidRequestError):
        make_config(num_speculative_tokens=-1)


def test_bench_reports_acceptance(tmp_path, capsys):
    import json
    from roseplay.bench import inproc as bench
    out = tmp_path / "bench.json"
    rc = bench.main(["--in-process", "--model", "default", "--device", "cpu", "--no-progress",
                     "--scenario", "identical", "--num-prompts", "3", "--input-len", "48",
                     "--output-len", "24", "--num-speculative-tokens", "3",
                     "--no-async-scheduling",     # every step proposes: drafts are counted
                     "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and "Mean acceptance length:" in text
    spec = json.loads(out.read_text())["summary"]["engine"]["spec_decode"]
    assert spec["num_draft_tokens"] >= spec["num_accepted_tokens"] == sum(spec["accepted_per_pos"])
    assert spec["mean_acceptance_length"] == pytest.approx(
        1 + spec["num_accepted_tokens"] / spec["num_drafts"])
    assert len(spec["acceptance_rate_per_pos"]) <= 3


@pytest.mark.parametrize("p", [1.0, 0.0])
def test_oracle_drafter_sets_acceptance_and_keeps_output(tmp_path, p):
    """The benchmarks' oracle (benchmarks/oracle.py), handed to LLM as its proposer: the
    target's own greedy outputs as drafts, kept with probability p."""
    prompts = PROMPTS[4:7]
    with LLM(**KW) as llm:
        ids = [llm.tokenizer.encode(t) for t in prompts]
        want = [list(o.outputs[0].token_ids) for o in llm.generate(
            [{"prompt_token_ids": i} for i in ids], GREEDY)]
    oracle = OracleProposer(zip(ids, want), p)
    with LLM(num_speculative_tokens=3, proposer=oracle, **KW) as llm:
        assert llm.engine.snapshot().spec_method == "oracle"
        got = [list(o.outputs[0].token_ids) for o in llm.generate(
            [{"prompt_token_ids": i} for i in ids], GREEDY)]
        c = llm.engine.counters
    assert got == want
    assert c.spec_decode_num_draft_tokens > 0
    assert c.spec_decode_num_accepted_tokens == (c.spec_decode_num_draft_tokens if p else 0)


def _fused_at_its_worst(positions, query, key, value, cos_sin, is_neox, k_cache, v_cache,
                        slots, tables, lens, scale, rows_shared=False):
    """The GPU's fused rotary + store + decode attention launch in its worst order: each
    row reads the cache as it was before the launch, plus its own K/V, plus with
    rows_shared (a verify step, AttentionMetadata.decode_rows_shared) the K/V of the rows
    just before it that store into its context (kernels/rotary_kv.py rows_before). A
    verify step that did not say so would read its earlier rows' K/V stale."""
    from kernels import reference
    k0, v0 = k_cache.clone(), v_cache.clone()
    q = reference.rotary_store_kv(positions, query, key, value, cos_sin, is_neox, k_cache,
                                  v_cache, slots)
    out = torch.empty_like(q)
    page = k_cache.shape[1]
    for i in range(q.shape[0]):
        k_i, v_i = k0.clone(), v0.clone()
        seen = [i] if slots[i] >= 0 else []
        while rows_shared and seen and seen[-1] > 0:
            r, p = seen[-1] - 1, int(lens[i]) - 2 - (i - seen[-1])
            if p < 0 or slots[r] != int(tables[i, p // page]) * page + p % page:
                break
            seen.append(r)
        for mine, stored in ((k_i, k_cache), (v_i, v_cache)):
            rows = stored.view(-1, *stored.shape[2:])
            for r in seen:
                mine.view(-1, *mine.shape[2:])[slots[r]] = rows[slots[r]]
        out[i] = reference.paged_decode_attention(q[i:i + 1], k_i, v_i, tables[i:i + 1],
                                                  lens[i:i + 1], scale)[0]
    return out


@pytest.mark.parametrize("mixed_tokens", [48, 0])
def test_verify_steps_through_the_graph_buffers_match_plain_engine(mixed_tokens):
    """The CUDA graphs' padded step buffers, run eagerly on the CPU (as in
    test_step_graphs.py): decode-only verify steps take the verify graphs (decode rows,
    bucketed past the decode buckets), verify rows beside prefill chunks the mixed graphs
    (without them, as cudagraph_mode full_decode_only: eagerly); greedy tokens equal the
    plain engine's. The fused decode op is the GPU's at its worst order
    (_fused_at_its_worst): plain decode steps and verify steps (rows_shared) take it."""

    from engine.worker.cuda_graphs import StepGraphs
    from kernels import reference
    from kernels.unified_attention import unified_attention_reference
    kw = dict(model="dummy:tiny", device="cpu", dtype="float32", block_size=4,
              num_blocks=160, max_num_batched_tokens=48, max_num_seqs=6,
              async_scheduling=False)          # every step proposes (no async chains)
    g = torch.Generator().manual_seed(4)
    prompts = [{"prompt_token_ids": torch.randint(0, 64, (n,), generator=g).tolist() * 3}
               for n in (3, 5, 7, 4, 6, 40)]     # the last prefills while others verify
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    with LLM(**kw) as llm:
        want = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
    with LLM(num_speculative_tokens=3, **kw) as llm:
        runner = llm.engine.executor.runner
        names = [n for n in dir(reference) if not n.startswith("_")
                 and callable(getattr(reference, n))]
        ops = SimpleNamespace(**{**{n: getattr(reference, n) for n in names},
                                 "rotary_decode_attention": _fused_at_its_worst},
                              paged_unified_attention=unified_attention_reference)
        runner.model.ops = ops
        for layer in runner.model.attention_layers():
            layer.ops = ops
        runner.graphs = graphs = StepGraphs(runner, 8, use_graphs=False, pad=True,
                                            max_mixed_tokens=mixed_tokens,
                                            max_verify_rows=6 * 4)
        kinds = []
        real_key = graphs.key

        def key(batch):
            k = real_key(batch)
            if batch.draft_rows is not None:
                kinds.append(k and k[0])
            return k
        graphs.key = key
        got = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
        assert got == want
        assert "verify" in kinds and ("mixed" if mixed_tokens else None) in kinds, kinds
        assert graphs.replays["verify"] == kinds.count("verify")
        assert max(graphs.verify_buckets) > max(graphs.decode_buckets)
        assert llm.engine.counters.spec_decode_num_accepted_tokens > 0


def test_stops_inside_an_accepted_run_end_the_request_there():
    """A stop string or stop token among a step's accepted tokens ends the request at
    it, as without speculation (the tokens after it are dropped)."""
    prompts = [LINE * 3, SHARED]
    with LLM(**KW) as llm:
        plain = llm.generate(prompts, GREEDY)
        stop_id = plain[1].outputs[0].token_ids[12]     # a token it will reach
        params = [SamplingParams(max_tokens=40, temperature=0, stop=["MESSENGER"]),
                  SamplingParams(max_tokens=40, temperature=0, stop_token_ids=[stop_id])]
        want = [(o.outputs[0].text, list(o.outputs[0].token_ids), o.outputs[0].finish_reason)
                for o in llm.generate(prompts, params)]
    # synchronous steps: every step proposes, so where drafts are accepted does not
    # depend on which steps async scheduling ran ahead (engine/core/async_steps.py _may_chain);
    # in this process: stops are matched in the front's OutputProcessor either way, and the
    # module's client covers the engine process
    with LLM(speculative_config=SPEC, async_scheduling=False, **KW) as llm:
        outs = [llm.generate([p], sp)[0] for p, sp in zip(prompts, params)]
        got = [(o.outputs[0].text, list(o.outputs[0].token_ids), o.outputs[0].finish_reason)
               for o in outs]
        assert got == want and all(r == "stop" for _, _, r in got)
        assert llm.engine.counters.spec_decode_num_accepted_tokens > 0
        # the core ended each request at its stop too: it generated no token past it
        assert llm.engine.counters.generated_tokens == sum(len(ids) for _, ids, _ in got)


def test_a_verified_run_is_cut_at_its_first_stop_and_at_the_length_cap():
    """What the core keeps of one step's accepted tokens: up to and with the first stop
    token, at most the room left under the length cap, and always the target's one token
    (a run's tokens past its end never enter the request, whatever the front cuts)."""
    def req(num_tokens, cap=100, stops=()):
        return SimpleNamespace(length_cap=cap, num_tokens=num_tokens, stop_ids=set(stops))
    assert _until_end(req(10), [5, 6, 7, 8]) == [5, 6, 7, 8]
    assert _until_end(req(10, stops={6, 8}), [5, 6, 7, 8]) == [5, 6]
    assert _until_end(req(10, stops={5}), [5, 6, 7]) == [5]
    assert _until_end(req(97), [5, 6, 7, 8]) == [5, 6, 7]
    assert _until_end(req(97, stops={7}), [5, 6, 7, 8]) == [5, 6, 7]
    assert _until_end(req(100), [5, 6]) == [5]


def test_seeded_rows_draw_from_their_own_generators():
    """Rows of seeded requests take their uniforms and residual draws from their own
    generator: the same seeds give the same tokens whatever the shared generator's state,
    and the target distribution holds for them too."""
    gen = torch.Generator().manual_seed(1)
    vocab, n = 6, 4000
    p = torch.softmax(torch.randn(vocab, generator=gen) * 1.5, 0)
    x = torch.multinomial(p.flip(0), n, replacement=True, generator=gen)

    def run(shared_seed):
        rows = {i: torch.Generator().manual_seed(1000 + i) for i in range(n)}
        return rejection_sample(p.expand(n, vocab).clone(), x, None,
                                torch.Generator().manual_seed(shared_seed), rows)
    first, second = run(0), run(99)
    assert torch.equal(first, second)
    emp = torch.bincount(first, minlength=vocab).double() / n
    assert 0.5 * (emp - p).abs().sum() < 0.04           # TV: ~0.015 expected at n = 4000
