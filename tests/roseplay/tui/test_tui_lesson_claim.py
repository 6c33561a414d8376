"""The lesson's measured claim (docs/TUI.md "What a teacher reads"): on the app's default
workload (the bundled model on the CPU, the engine in its own process, the app's pool,
scenario mixed with 32 requests in flight over max_num_seqs 16) most of TTFT is queueing,
the share the Timing panel's `└ queue` line shows, over the requests that line counts:
those whose first token came in the window (running or finished; `window_shares`), after
warm-up. It read the requests that finished in the window (`recent_ttft_parts`), which
the line has not counted since 012e7f5."""
from __future__ import annotations

import time

import pytest

from roseplay.tui.defaults import TUI_CONCURRENCY, TUI_MAX_NUM_SEQS, TUI_NUM_BLOCKS, TUI_SCENARIO
from roseplay.tui.widgets.ttft_split import window_shares
from roseplay.workload.flags import WORKLOAD_DEFAULTS

pytestmark = pytest.mark.timeout(300)
QUEUE_SHARE_MIN = 0.5          # "mostly": more than half of the summed TTFT


def test_default_workload_ttft_is_mostly_queueing():
    from roseplay.workload.source import start_live
    d = WORKLOAD_DEFAULTS["roseplay"]
    source = start_live(dict(num_blocks=TUI_NUM_BLOCKS, max_num_seqs=TUI_MAX_NUM_SEQS),
                        scenario=TUI_SCENARIO, concurrency=TUI_CONCURRENCY,
                        input_len=d.input_len, output_len=d.output_len,
                        temperature=d.temperature)
    try:
        deadline = time.monotonic() + 60     # the first 16 requests meet no queue: 40
        while source.snapshot().step < 40 and time.monotonic() < deadline:   # steps first
            time.sleep(0.1)
        start = source.snapshot().time
        seen: dict = {}              # each request's latest view (an ended one leaves)
        while time.monotonic() < deadline:
            time.sleep(0.5)
            seen.update((r.request_id, r) for r in source.snapshot().requests)
            n, shares = window_shares(seen.values(), start)
            if n >= 16:
                break
    finally:
        source.close()
    assert n >= 16, f"only {n} first tokens in 60 s"
    print(f"queue share of TTFT {shares[0]:.2f} over {n} requests")
    assert shares[0] > QUEUE_SHARE_MIN
