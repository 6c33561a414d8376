"""A step leaves nothing for the garbage collector: its plan, chunks, batch and outputs
are freed by their reference counts when the step ends. A reference cycle made once a
step (a steady decode plan and its kept columns pointed at each other) set off a young
collection every ~3 decode steps of W1 (12-19 ms of a run on an H200's host)."""
import gc
import time

import pytest

from engine import LLM
from engine.core.steady_decodes import MIN_DECODES
from engine.outputs import CoreRequest
from engine.request import SamplingParams

N = MIN_DECODES + 6         # enough decodes for the steady path (engine/core/steady_decodes.py)
SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
        "prompt_lookup_max": 3}


@pytest.mark.parametrize("spec", [None, SPEC], ids=["plain", "ngram"])
def test_steps_leave_nothing_for_the_garbage_collector(spec):
    """Mixed steps, steady decode steps, finishing steps (staggered lengths), prefix hits
    (a shared prefix) and, with speculation, verify steps: the collector, switched off
    for the run, finds nothing after any step."""
    with LLM(model="dummy:tiny", device="cpu", dtype="float32", max_num_seqs=N,
             max_num_batched_tokens=512, speculative_config=spec) as llm:
        engine = llm.engine
        for i in range(N):
            params = SamplingParams(max_tokens=8 + i % 7, temperature=0, ignore_eos=True)
            prompt = (7,) * 16 + (1 + i % 50, 2 + i % 40) * 4
            engine.add(CoreRequest(f"g{i}", prompt, params, time.perf_counter()))
        steady, found = 0, []
        gc.collect()
        gc.disable()
        gc.freeze()         # a full collection then walks only what the steps allocated
        try:
            while engine.has_unfinished():
                engine.step()
                steady += engine.scheduler._steady is not None
                found.append(gc.collect())
        finally:
            gc.unfreeze()
            gc.enable()
        assert spec is not None or steady > 5, "no steady decode steps ran"
        assert spec is None or engine.counters.spec_decode_num_drafts > 0, "nothing verified"
        assert engine.counters.prefix_hit_tokens > 0
        assert sum(found) == 0, found


def test_an_added_prompt_is_the_submitted_tuple():
    """engine.add keeps a CoreRequest's token tuple (the collector untracks a tuple of
    ints at its first pass; a list copy of a 512-id prompt was walked again in each
    generation it reached, ~0.3-0.8 ms of W1's 256 submissions on a 2-core CPU), and
    the request's token reads across prompt and output stay lists of the right ids."""
    with LLM(model="dummy:tiny", device="cpu", dtype="float32") as llm:
        engine = llm.engine
        prompt = tuple(range(3, 23))
        req = engine.add(CoreRequest("t", prompt, SamplingParams(max_tokens=4, temperature=0,
                                                                   ignore_eos=True),
                                     time.perf_counter()))
        assert req.prompt_token_ids is prompt
        while engine.has_unfinished():
            engine.step()
        out = req.output_token_ids
        assert len(out) == 4
        assert req.all_token_ids() == [*prompt, *out]
        assert list(req.token_slice(18, 22)) == [21, 22, *out[:2]]
        assert req.token_slice(18, 22) == [21, 22, *out[:2]]
        assert list(req.token_slice(2, 6)) == [5, 6, 7, 8]


def test_requests_past_the_ended_window_are_freed_at_the_next_launch(monkeypatch):
    """An ended request that leaves the snapshot's window (RECENT_FINISHED) is freed at
    the next step's launch, while the device runs that step, not in the step that ends
    requests (~10 us each where nothing else holds its prompt: W1's finishing steps)."""
    import weakref
    from engine.core import core as core_mod
    monkeypatch.setattr(core_mod, "RECENT_FINISHED", 2)
    with LLM(model="dummy:tiny", device="cpu", dtype="float32") as llm:
        engine = llm.engine
        refs = {}
        for i, n in enumerate((1, 2, 3, 12)):      # one ends a step; the last runs on
            params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
            req = engine.add(CoreRequest(f"w{i}", (5 + i,) * 6, params, time.perf_counter()))
            refs[req.request_id] = weakref.ref(req)
        del req
        ended = []
        while "w2" not in ended:
            ended += [f.request_id for f in engine.step().finished]
        assert ended == ["w0", "w1", "w2"]
        first = refs["w0"]()
        assert first is not None and first in engine._retired   # out of the window
        del first
        engine.step()                                            # the next launch
        assert refs["w0"]() is None and refs["w1"]() is not None
        assert not engine._retired
