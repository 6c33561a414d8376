"""The steady decode step's kept columns (engine/core/steady_decodes.py) plan and build
exactly what the pass over the requests does: two schedulers run the same async steps,
one of them made to forget its columns before every plan."""
import numpy as np
import pytest

from engine.config import SchedulerConfig
from engine.core.batch_builder import build_step_batch
from engine.core.kv.block_pool import BlockPool
from engine.core.kv.counters import Counters
from engine.core.launched import commit_plan
from engine.core.scheduler import Scheduler
from engine.core.steady_decodes import MIN_DECODES
from engine.request import Request, SamplingParams, add_pending_tokens, \
    append_sampled
from tests.engine.core.test_scheduler_units import end

BS = 4
N = MIN_DECODES + 24     # running requests: the kept columns need MIN_DECODES decodes,
#                          so three groups of length caps can end with columns kept


def make(num_blocks, mode, seqs=N):
    counters = Counters()
    knobs = SchedulerConfig(max_num_batched_tokens=1024, max_num_seqs=seqs,
                            scheduling_mode=mode)
    return Scheduler(knobs, BlockPool(num_blocks, BS, counters), counters)


STOP = 3          # with stops: the stop token, sampled by one row at each of STOP_STEPS
STOP_STEPS = (6, 9, 10, 14, 17)


def requests(dedup: bool, stops: bool = False):
    """Staggered lengths (block boundaries at different steps, length caps at different
    steps), one of them sampled (not greedy); with dedup, two identical prompts: the
    follower shares its leader's last, partly filled block, and the first decode into it
    copies it (a slow decode); with stops, every request stops on STOP (which run()
    samples at a few steps, one row each)."""
    reqs = [Request(f"r{i}", [10 + i] * (3 + i % 7), SamplingParams(
        max_tokens=20 + i % 11, temperature=0)) for i in range(N)]
    if stops:
        for r in reqs:
            r.stop_ids = frozenset([STOP])     # as the engine's add sets them
    reqs[2] = Request("seeded", [12] * 5, SamplingParams(max_tokens=24, temperature=0.7,
                                                          seed=3))   # a sampled row too
    if dedup:
        reqs[-1] = Request("twin", [10] * 3, SamplingParams(max_tokens=25, temperature=0))
    return reqs


def signature(sched, plan, batch):
    reqs = sorted(sched.running + list(sched.waiting), key=lambda r: r.request_id)
    return (
        [(c.request.request_id, c.start, c.num_tokens) for c in plan.chunks],
        plan.copies, [(r.request_id, blocks) for r, blocks in plan.preempted],
        [(r.request_id, r.status, r.num_computed_tokens, list(r.output_token_ids),
          list(r.block_table), r.pending_row) for r in reqs],
        list(sched.pool.refcounts),
        None if batch is None else plain(batch))


def plain(v):
    """A batch as comparable values (arrays as lists, dataclasses as dicts)."""
    if isinstance(v, np.ndarray):
        return v.tolist()
    if hasattr(v, "__dataclass_fields__"):
        return {k: plain(x) for k, x in vars(v).items()}
    return v


def refills():
    """A closed loop's new requests: short prompts and some long ones (300, 450 tokens:
    several admitted at once can leave a prompt's chunk partial)."""
    lengths = (5, 300, 7, 450, 9, 6)
    return iter([Request(f"n{k}", [600 + k] * lengths[k % 6], SamplingParams(
        max_tokens=12 + k % 9, temperature=0)) for k in range(60)])


def run(num_blocks, mode, dedup, forget, seqs=N, stops=False, refill=False):
    """The engine's async loop without a model: commit the step in flight (its tokens
    pending), plan and build the next, then read the first one's tokens (token 5 + row;
    with stops, STOP for one row at each of STOP_STEPS); with refill, a new request
    joins as one ends (a closed loop).
    kept: plans with columns, those with rows left out, stop-token finishes whose next
    plan still had columns (the stopped request's row in the step in flight void), and
    plans with columns after a plan with prompts (those requests joined the columns)."""
    sched = make(num_blocks, mode, seqs)
    for r in requests(dedup, stops):
        sched.add(r)
    more = refills() if refill else iter(())
    sigs, kept, inflight, stopped = [], [0, 0, 0, 0], None, False
    for step in range(80):
        if inflight is not None:
            plan, rows = inflight
            if not commit_plan(plan, sched, BS, True, rows=rows):
                add_pending_tokens(rows)
        if forget:
            sched._steady = None
        nxt = sched.schedule()
        cols = nxt.decode_columns
        kept[0] += cols is not None
        kept[1] += cols is not None and cols.fed_rows is not None    # rows left out
        kept[2] += stopped and cols is not None
        kept[3] += cols is not None and inflight is not None and bool(inflight[0].prefills)
        stopped = False
        batch = None
        if nxt:
            batch, rows = build_step_batch(nxt, sched.followers, BS, sched.kv.tables,
                                           device_fed=inflight is not None)
        if inflight is not None:
            tokens = [5 + i for i in range(len(inflight[1]))]
            if stops and step in STOP_STEPS:
                tokens[7 * step % len(tokens)] = STOP
            ended = append_sampled(inflight[1], tokens, 1.0, [], [], [])
            end(sched, *(r for r, _ in ended))       # together, as the engine ends them
            for r, reason in ended:
                stopped |= reason == "stop"
                joining = next(more, None)
                if joining is not None:
                    sched.add(joining)
        sched.check_columns()
        sched.kv.tables.check(sched.running)
        sigs.append(signature(sched, nxt, batch))
        inflight = (nxt, rows) if nxt else None
        if not sched.running and not sched.waiting:
            break
    return sigs, kept


@pytest.mark.parametrize("mode", ["budget", "mixed-chunk", "prefill-first"])
@pytest.mark.parametrize("num_blocks,dedup,seqs,stops,refill", [
    (1000, False, N, False, False), (1000, True, N, False, False),
    (400, False, N, False, False), (400, True, N, False, False),
    (1000, False, N - 20, False, False), (400, False, N - 20, False, False),
    (1000, False, N, True, False), (400, True, N, True, False),
    (1000, False, N, True, True), (400, True, N, False, True), (1000, True, N - 20, True, True)])
def test_kept_columns_plan_and_build_what_the_pass_over_the_requests_does(
        num_blocks, dedup, seqs, stops, refill, mode):
    """400 blocks: boundary reservations preempt; dedup: a copy-on-write decode; fewer
    sequence slots than requests: those waiting are admitted as others end, beside kept
    columns. With 1000 blocks, the steps after a group of requests reaches its length
    caps keep their columns, less those rows (fed from the kept rows of the step in
    flight), and once the sampled request has ended the rest are all greedy; with stop
    tokens, so do the steps after a request stops (its row in the step in flight void);
    in a closed loop (refill), requests whose prompts a step finished join the columns
    of the next, fed from their prompts' sample rows."""
    steady, kept = run(num_blocks, mode, dedup, False, seqs, stops, refill)
    general, none = run(num_blocks, mode, dedup, True, seqs, stops, refill)
    assert kept[0] >= 5 and none == [0, 0, 0, 0]    # the kept columns planned many steps
    # (prefill-first runs a step's prompts in plans without decodes: none to join, and
    # the decodes after them do not all come with one step's tokens: no columns there)
    first = mode == "prefill-first"
    assert kept[1] >= (2 if num_blocks == 1000 and not (first and (refill or seqs < N))
                       else 0)
    assert kept[2] >= (3 if stops and num_blocks == 1000 and not (refill and first) else 0)
    assert kept[3] >= (2 if (refill or seqs < N) and num_blocks == 1000 and not first else 0)
    assert steady == general


@pytest.mark.parametrize("seqs", [N, N - 20])
def test_a_wide_engine_emits_what_the_synchronous_one_does(monkeypatch, seqs):
    """N requests decoding together under async scheduling (steady steps, their tokens
    read by append_steady, some after rows that reached their length caps were left
    out; with fewer sequence slots, those waiting join the columns as others end): the
    tokens and finish reasons (a stop token, the length cap) equal the synchronous
    engine's; every request's inter-token gaps are one per token after its first;
    check_invariants compares the kept columns with the requests after every step."""
    import engine.core.core as core
    from engine import LLM

    steady = []
    real = core.append_steady
    monkeypatch.setattr(core, "append_steady",    # (whether it follows rows left out)
                        lambda *a: steady.append(a[0].fed_rows is not None) or real(*a))
    kw = dict(model="dummy:tiny", device="cpu", dtype="float32", block_size=8,
              max_num_seqs=seqs, max_num_batched_tokens=4096, check_invariants=True)
    prompts = [{"prompt_token_ids": [(7 * i + j) % 500 + 1 for j in range(5 + i % 9)]}
               for i in range(N)]

    def generate(params, **more):
        with LLM(**kw, **more) as llm:
            outs = [(list(o.outputs[0].token_ids), o.outputs[0].finish_reason,
                     len(o.metrics.itls)) for o in llm.generate(prompts, params)]
            gaps = llm.engine.stats.recent_itls      # the engine's own: one per token
            assert len(gaps) == sum(len(t) - 1 for t, _, _ in outs) < gaps.maxlen
            assert all(gap >= 0 for _, gap in gaps)
            return outs

    plain = generate([SamplingParams(max_tokens=12 + i % 7, temperature=0, ignore_eos=True)
                      for i in range(N)], async_scheduling=False)
    stop = plain[0][0][5]          # a token some request samples mid-way
    params = [SamplingParams(max_tokens=12 + i % 7, temperature=0, ignore_eos=True,
                             stop_token_ids=[stop]) for i in range(N)]
    want = generate(params, async_scheduling=False)
    steady.clear()
    got = generate(params, async_scheduling=True)
    assert got == want and steady and any(steady)
    assert {reason for _, reason, _ in got} == {"stop", "length"}
    assert all(gaps == len(tokens) - 1 for tokens, _, gaps in got)


def test_logprobs_rows_keep_the_steady_emit(monkeypatch):
    """One request in eight asks logprobs (the TUI's workload): the steady steps still
    read their tokens by append_steady, and every request's tokens and logprobs (one
    entry per token, the sampled token first, rank 1) equal the synchronous engine's."""
    import engine.core.core as core
    from engine import LLM

    steady = []
    real = core.append_steady
    monkeypatch.setattr(core, "append_steady",      # (whether a row asked logprobs)
                        lambda *a: steady.append(any(r.params.logprobs is not None
                                                     for r in a[0].requests)) or real(*a))
    kw = dict(model="dummy:tiny", device="cpu", dtype="float32", block_size=8,
              max_num_seqs=N, max_num_batched_tokens=4096, check_invariants=True)
    prompts = [{"prompt_token_ids": [(5 * i + j) % 500 + 1 for j in range(4 + i % 9)]}
               for i in range(N)]
    params = [SamplingParams(max_tokens=10 + i % 5, temperature=0, ignore_eos=True,
                             logprobs=2 if i % 8 == 3 else None) for i in range(N)]

    def generate(**more):
        with LLM(**kw, **more) as llm:
            return [o.outputs[0] for o in llm.generate(prompts, params)]

    want = generate(async_scheduling=False)
    steady.clear()
    got = generate(async_scheduling=True)
    assert any(steady)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.token_ids == w.token_ids, i
        if i % 8 != 3:
            assert g.logprobs is None
            continue
        assert len(g.logprobs) == len(g.token_ids)
        assert [lp.token_ids[0] for lp in g.logprobs] == list(g.token_ids)
        assert all(lp.rank == 1 for lp in g.logprobs)
        assert [lp.token_ids for lp in g.logprobs] == [lp.token_ids for lp in w.logprobs]
        assert [v for lp in g.logprobs for v in lp.logprobs] == pytest.approx(
            [v for lp in w.logprobs for v in lp.logprobs], abs=1e-5)


def test_a_plan_enters_the_steady_state_only_with_every_decode_token_pending():
    """append_steady gives a step's rows one inter-token gap, so a plan keeps columns
    only if every decode's last token comes with the step in flight (after a
    prefill-first step of prompts alone, the older decodes' tokens do not), and only if
    what it leaves out of the running order are requests its pending tokens end."""
    from engine.core.step_plan import ScheduledChunk, StepPlan
    from engine.core.steady_decodes import DecodeColumns
    reqs = [Request(f"r{i}", [3] * 5, SamplingParams(max_tokens=10)) for i in range(4)]
    for i, r in enumerate(reqs):
        r.output_token_ids, r.pending_row = [7, -1], i     # a token pending each
    plan = StepPlan(decodes=[ScheduledChunk(r, 6, 1, True) for r in reqs])
    assert DecodeColumns.of(plan, reqs).requests == reqs
    reqs[2].pending_row = -1                # its last token came with an earlier step
    assert DecodeColumns.of(plan, reqs) is None
    reqs[2].pending_row = 2
    ending = Request("end", [3] * 5, SamplingParams(max_tokens=2))
    ending.output_token_ids, ending.pending_row = [7, -1], 4    # its pending token ends it
    assert DecodeColumns.of(plan, reqs + [ending]).requests == reqs
    ending.length_cap = 15                  # it decodes on: left out, so no columns
    assert DecodeColumns.of(plan, reqs + [ending]) is None
