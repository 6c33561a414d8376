"""The lesson's measured claim (docs/TUI.md "What a teacher reads"): on the app's default
workload (the bundled model on the CPU, the engine in its own process, the app's pool,
scenario mixed with 32 requests in flight over max_num_seqs 16) most of TTFT is queueing,
the share the Timing panel's `└ queue` line shows. Measured from the engine's TTFT
splits of the requests that finished in a window after warm-up."""
from __future__ import annotations

import time

import pytest

from roseplay.tui.defaults import TUI_CONCURRENCY, TUI_MAX_NUM_SEQS, TUI_NUM_BLOCKS, TUI_SCENARIO
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
        rows: list = []
        while len(rows) < 16 and time.monotonic() < deadline:
            time.sleep(0.5)
            rows = [x for x in source.snapshot().recent_ttft_parts if x[0] > start]
    finally:
        source.close()
    assert len(rows) >= 16, f"only {len(rows)} requests finished in 60 s"
    queued = sum(x[1] for x in rows)
    total = sum(x[1] + x[2] + x[3] for x in rows)
    print(f"queue share of TTFT {queued / total:.2f} over {len(rows)} requests")
    assert queued / total > QUEUE_SHARE_MIN
