"""`roseplay --compare kv_cache_dtype=auto,fp8`: the fp8 side's KV map says what a block
costs beside the model dtype's (same bytes, more blocks), and the B / A table's bottom
border counts the greedy requests whose tokens agree on both sides and where they
diverge."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine.codes import DECODING, FINISHED
from engine.config import DEFAULT_CPU_BLOCKS
from roseplay.tui.compare import parse_compare, start_compare
from roseplay.tui.compare_app import CompareApp, greedy_workload
from roseplay.tui.widgets.agreement import TokenAgreement
from roseplay.tui.widgets.kv_panel import pool_title
from tests.roseplay.tui.helpers import ENGINE, fast_idle, screen_text, sync, wait_for

pytestmark = pytest.mark.timeout(180)


def _req(rid, tokens, state=FINISHED, n=None):
    return SimpleNamespace(request_id=rid, state=state, output_tokens=n or len(tokens),
                           output_tail=tuple(tokens[-64:]))


def test_agreement_counts_each_request_once_and_finds_the_first_difference():
    agree = TokenAgreement()
    assert agree.text() == "B's tokens = A's: no request finished on both sides yet"
    a = SimpleNamespace(requests=(_req("c-0", [1, 2, 3]), _req("c-1", [1, 2, 3, 4]),
                                  _req("c-2", list(range(100))), _req("c-3", [5])))
    b = SimpleNamespace(requests=(_req("c-0", [1, 2, 3]), _req("c-1", [1, 2, 9, 9]),
                                  _req("c-2", list(range(99)) + [7]),
                                  _req("c-3", [5], state=DECODING)))
    agree.feed(a, b)
    agree.feed(a, b)                                  # the same snapshots again: no recount
    assert (agree.identical, agree.diverged, agree.first_diffs) == (1, 2, [2])
    assert agree.text() == ("B's tokens = A's in 1/3 requests · 2 diverged after 2 equal "
                            "tokens (median)")


def test_agreement_never_cuts_the_median_off_a_narrow_border():
    """At 80x24 the border has 74 columns: the line was cut to "(first at token 18,
    medi…", a first difference where a median was meant. Each width gets a whole form."""
    agree = TokenAgreement()
    agree.identical, agree.diverged, agree.first_diffs = 28, 16, [17, 18, 19]
    for width in (74, 60, 48):
        text = agree.text(width)
        assert len(text) <= width and "…" not in text
        assert "median" in text and "16 diverged" in text and "28/44" in text, text
    assert agree.text(20) == "same tokens 28/44"


def test_agreement_waits_for_the_side_that_runs_behind():
    """A finished c-0 and c-1 long ago (no longer in its snapshot) when B finishes them;
    B runs ahead on c-2, which A finishes later."""
    agree = TokenAgreement()
    agree.feed(SimpleNamespace(requests=(_req("c-0", [4, 5]), _req("c-1", [6]))),
               SimpleNamespace(requests=(_req("c-0", [4], state=DECODING),)))
    assert agree.identical + agree.diverged == 0
    agree.feed(SimpleNamespace(requests=()),
               SimpleNamespace(requests=(_req("c-0", [4, 5]), _req("c-1", [7]),
                                         _req("c-2", [1]))))
    assert (agree.identical, agree.diverged, agree.first_diffs) == (1, 1, [0])
    agree.feed(SimpleNamespace(requests=(_req("c-2", [1]),)), SimpleNamespace(requests=()))
    agree.feed(SimpleNamespace(requests=(_req("c-2", [1]),)),
               SimpleNamespace(requests=(_req("c-2", [1]),)))
    assert (agree.identical, agree.diverged) == (2, 1)


def test_pool_title_shows_an_fp8_blocks_bytes_beside_the_model_dtypes():
    snap = SimpleNamespace(num_blocks=8192, block_size=16, kv_cache_dtype="fp8",
                           kv_bytes_per_rank=192 << 20, dtype="float32")
    assert pool_title(snap, 200) == ("KV cache · 8192 blocks × 16 tokens · fp8 24 KiB a block "
                                     "(float32 96)")
    assert pool_title(snap, 40) == "KV · 8192 × 16 tok · fp8"
    auto = SimpleNamespace(**dict(vars(snap), kv_cache_dtype="auto", num_blocks=2048))
    assert pool_title(auto, 200) == "KV cache · 2048 blocks × 16 tokens"


def test_kv_cache_dtype_is_a_compare_knob():
    assert parse_compare("kv_cache_dtype=auto,fp8") == ("kv_cache_dtype", ["auto", "fp8"])


@sync
async def test_compare_auto_against_fp8_live(monkeypatch):
    """Two in-process engines (dummy:tiny, the CPU's default pool bytes) on one greedy
    stream: B holds four times A's blocks (float32 -> e4m3) in the same bytes, and the
    finished requests' tokens are judged against A's under the B / A table."""
    fast_idle(monkeypatch)
    src = start_compare(dict(ENGINE, num_blocks=None), "kv_cache_dtype", ["auto", "fp8"],
                        scenario="shared-prefix", concurrency=4, rate=None, input_len=48,
                        output_len=16, temperature=0.0, in_process=True)
    app = CompareApp(source=src)
    try:
        assert greedy_workload(src)
        async with app.run_test(size=(160, 40)) as pilot:
            assert await wait_for(pilot, lambda: app.agreement.identical
                                  + app.agreement.diverged >= 6, 60)
            a, b = src.snapshots()
            assert (a.num_blocks, b.num_blocks) == (DEFAULT_CPU_BLOCKS, 4 * DEFAULT_CPU_BLOCKS)
            assert a.kv_bytes_per_rank == b.kv_bytes_per_rank
            app.refresh_panels()
            await pilot.pause(0.2)
            text = screen_text(app)
            assert f"{4 * DEFAULT_CPU_BLOCKS} blocks × 16 tokens · fp8" in text
            assert "B's tokens = A's in " in text
            await pilot.press("q")
    finally:
        src.close()
