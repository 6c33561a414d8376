"""Issue 22, defect 2: `--num-blocks 9`, the value `--num-blocks 3`'s error recommended,
served "step 0" forever (every mixed request refused as too long for the pool, the
errors kept in the driver, nothing shown, the driver spinning a core). Now the check
sizes the pool from the scenario's longest request, the number it recommends serves,
a refusal is on screen, and a refused workload waits instead of spinning."""
from __future__ import annotations

import time

import pytest

from engine.config import InvalidRequestError
from roseplay.tui.app import RoseplayApp
from roseplay.cli import build_parser, check_engine
from roseplay.tui.widgets.status import StatusBar
from tests.roseplay.tui.helpers import (fast_idle, live_source, sync, wait_for,
                                        widget_text)

pytestmark = pytest.mark.timeout(180)
DUMMY = ["--model", "dummy:tiny", "--device", "cpu"]


def _recommended(argv) -> int:
    problem = check_engine(build_parser().parse_args(argv))
    assert problem is not None and "use --num-blocks" in problem, problem
    return int(problem.split("use --num-blocks ")[1].split()[0])


def test_the_recommended_pool_serves_the_scenario():
    """The number the error recommends serves the app's default scenario: its requests
    finish, none refused; one block fewer is refused before the app opens."""
    n = _recommended(DUMMY + ["--num-blocks", "3"])
    assert check_engine(build_parser().parse_args(DUMMY + ["--num-blocks", str(n)])) is None
    assert "use --num-blocks" in check_engine(
        build_parser().parse_args(DUMMY + ["--num-blocks", str(n - 1)]))
    src = live_source(scenario="mixed", input_len=64, output_len=64, concurrency=4,
                      engine=dict(num_blocks=n))
    try:
        deadline = time.monotonic() + 60
        while src.snapshot().counters.finished < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert src.snapshot().counters.finished >= 3
        assert src.driver.submit_errors == []
    finally:
        src.close()


def test_the_bundled_models_recommended_pool_starts_and_serves():
    """With a tokenizer the prompts are text: the recommendation counts them with it, and
    the loaded engine's exact check (start_live) accepts that pool."""
    from roseplay.workload.source import start_live
    n = _recommended(["--num-blocks", "3"])
    # in this process: start_live's check is the same, without an engine process's start
    src = start_live(dict(num_blocks=n), scenario="mixed", concurrency=4, input_len=64,
                     output_len=64, temperature=0.8, in_process=True)
    try:
        deadline = time.monotonic() + 120
        while src.snapshot().counters.finished < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert src.snapshot().counters.finished >= 1 and src.driver.submit_errors == []
    finally:
        src.close()
    with pytest.raises(InvalidRequestError, match=f"use --num-blocks {n} or more"):
        start_live(dict(num_blocks=n - 1), scenario="mixed", input_len=64, output_len=64,
                   in_process=True)


def test_a_scenario_the_pool_cannot_hold_is_refused_when_picked():
    src = live_source(scenario="shared-prefix", input_len=16, output_len=16,
                      engine=dict(num_blocks=4))     # 16 + 16 tokens: 2 blocks, + 1
    try:
        with pytest.raises(InvalidRequestError, match="use --num-blocks 6 or more"):
            src.set_scenario("hot-scan")         # 4 x 16 + 16 tokens: 5 blocks, + 1
        src.set_scenario("identical")
    finally:
        src.close()


def test_a_refused_workload_waits_instead_of_spinning():
    """Every submission refused: the driver used to resubmit at once, forever."""
    src = live_source()
    calls = []

    def refuse(*args, **kwargs):
        calls.append(time.monotonic())
        raise InvalidRequestError("prompt + max_tokens = 376 tokens can never fit the KV pool")
    try:
        src.driver.stop()           # a fresh driver, on a loop that refuses everything
        from roseplay.workload.driver import WorkloadDriver
        src.loop.submit = refuse
        driver = WorkloadDriver(src.loop, "mixed", concurrency=32, workload=src.driver.workload)
        driver.start()
        time.sleep(1.5)
        driver.stop()
        assert 1 <= len(calls) <= 10, len(calls)        # not thousands
        assert driver.refused == len(calls) and "never fit" in driver.last_error
        assert len(driver.submit_errors) <= 100
    finally:
        src.close()


@sync
async def test_refused_requests_are_on_the_top_line(monkeypatch):
    fast_idle(monkeypatch)
    src = live_source()

    def refuse(*args, **kwargs):
        raise InvalidRequestError("prompt + max_tokens = 376 tokens can never fit the KV pool")
    try:
        src.loop.submit = refuse
        app = RoseplayApp(source=src)
        async with app.run_test(size=(200, 40)) as pilot:
            assert await wait_for(pilot, lambda: "refused: InvalidRequestError: prompt + "
                                  "max_tokens = 376" in widget_text(app.query_one(StatusBar)),
                                  10), widget_text(app.query_one(StatusBar))
    finally:
        src.close()
