"""RequestMetrics (engine/request.py): a request's latencies from its token times, the
inter-token gaps made when read."""
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
