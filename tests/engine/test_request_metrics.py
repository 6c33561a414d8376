"""RequestMetrics (engine/request_output.py): a request's latencies from its token times,
its phases from its first scheduling, the inter-token gaps made when read."""
import pytest

from engine.request_output import RequestMetrics


def test_metrics_from_token_times():
    m = RequestMetrics.from_times(1.0, [1.5, 1.75, 2.25, 2.5], cached=16, preemptions=1)
    assert (m.ttft, m.tpot, m.e2e) == (0.5, 1.0 / 3, 1.5)
    assert (m.first_token_time, m.last_token_time) == (1.5, 2.5)
    assert m.token_times == (1.5, 1.75, 2.25, 2.5)
    assert m.itls == (0.25, 0.5, 0.25)
    assert (m.num_cached_tokens, m.num_preemptions) == (16, 1)


def test_metrics_without_tokens():
    m = RequestMetrics.from_times(1.0, [])
    assert m.ttft is m.tpot is m.e2e is None and m.itls == () and m.token_times == ()
    one = RequestMetrics.from_times(1.0, [1.25])
    assert one.ttft == 0.25 and one.tpot is None and one.itls == ()


def test_request_phases_from_the_first_scheduling():
    """vLLM's phases: queued = scheduled - arrival, prefill = first token - scheduled,
    inference = last token - scheduled, decode = last token - first token."""
    m = RequestMetrics.from_times(1.0, [1.5, 1.75, 2.5], scheduled=1.25)
    assert m.first_scheduled_time == 1.25
    assert (m.queued_time, m.prefill_time, m.inference_time, m.decode_time) \
        == (0.25, 0.25, 1.25, 1.0)
    assert m.queued_time + m.prefill_time == m.ttft


def test_request_phases_it_never_reached():
    never = RequestMetrics.from_times(1.0, [])            # cancelled while waiting
    assert never.first_scheduled_time is None
    assert never.queued_time is never.prefill_time is never.inference_time is None
    assert never.decode_time is None
    no_token = RequestMetrics.from_times(1.0, [], scheduled=1.5)   # cancelled in prefill
    assert no_token.queued_time == 0.5
    assert no_token.prefill_time is no_token.inference_time is no_token.decode_time is None


def test_llm_outputs_carry_the_first_scheduled_time():
    """The engine's first scheduling reaches RequestOutput.metrics (vLLM's
    first_scheduled_time): with one sequence at a time the second request waits for the
    first to finish, and its queue time holds that wait."""
    from engine import LLM, SamplingParams
    llm = LLM(device="cpu", max_num_seqs=1)
    first, second = llm.generate(["To be, or not to be", "Now is the winter"],
                                 SamplingParams(max_tokens=4, temperature=0.0,
                                                ignore_eos=True))
    for out in (first, second):
        m = out.metrics
        assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time
        assert m.queued_time + m.prefill_time == pytest.approx(m.ttft, abs=1e-9)
        assert m.inference_time == pytest.approx(m.prefill_time + m.decode_time, abs=1e-9)
    assert second.metrics.first_scheduled_time >= first.metrics.last_token_time
    assert second.metrics.queued_time > 0
