"""A typed prompt's token trace (roseplay/workload/own_prompts.py): it comes back in the
prompt's own final output and stays in the source's snapshots after the engine's window
of traces (engine/core/stats.py TRACE_KEEP) has moved on, on the default path (the
engine in its own process) under a workload where every request is traced."""
from __future__ import annotations

import dataclasses
import queue
import subprocess
import sys
import textwrap

from engine.outputs import TokenTrace
from roseplay.workload import own_prompts, source as source_mod
from roseplay.workload.driver import PROCESS_TAG, TOP_LOGPROBS
from tests.helpers import wait_for
from tests.roseplay.tui.helpers import live_source


def test_a_typed_prompts_trace_outlives_the_engines_window(monkeypatch):
    monkeypatch.setattr(source_mod, "LOGPROBS_EVERY", 1)     # every request has a trace
    src = live_source(scenario="shared-prefix", concurrency=4, in_process=False)
    try:
        rid = src.submit("tell me a story", sampling={"max_tokens": 6, "temperature": 0})
        trace = wait_for(lambda: src.workload() and src.loop.snapshot().trace(rid) is None
                         and src.snapshot().trace(rid), 120,
                         "the engine's window moving past the typed prompt")
        assert len(trace) == trace.num_tokens == 6
        assert trace.top == TOP_LOGPROBS + 1 and trace.raw_logprobs
        assert trace.logprobs_at(5).token_ids[0] == trace.ids()[5]    # entry 0: the sampled
    finally:
        src.close()


class _Ended:
    """A stream whose request has ended (what engine/front/stream.py hands back)."""

    def __init__(self, trace):
        self.output = type("Output", (), {"trace": trace})()

    def get(self, timeout=None):
        return type("Event", (), {"finished": True})()


class _Running:
    def get(self, timeout=None):
        raise queue.Empty


@dataclasses.dataclass(frozen=True)
class _Snap:
    traces: tuple = ()


def _trace(rid: str) -> TokenTrace:
    return TokenTrace(rid, 1, bytes(4), bytes(8), bytes(1))


def test_own_prompts_keep_the_latest_traces_and_merge_once():
    own = own_prompts.OwnPrompts()
    n = own.KEEP + 2
    for k in range(n):
        own.add(f"you-{k}", _Ended(_trace(f"you-{k}")))
    own.add("you-running", _Running())
    own.add("you-untraced", _Ended(None))
    engine_has = _trace("you-1")
    snap = _Snap((engine_has,))
    own.drain()
    merged = own.merge(snap)
    ids = [t.request_id for t in merged.traces]
    assert ids == ["you-1"] + [f"you-{k}" for k in range(2, n)]    # the latest KEEP, once each
    assert merged.traces[0] is engine_has
    assert own.merge(snap) is merged                 # unchanged: the same object
    assert own.merge(_Snap()) is not merged          # a new engine snapshot: merged anew
    own.drain()                                      # the running one stays held
    assert list(own._streams) == ["you-running"]


def test_typed_prompts_of_two_attached_processes_do_not_collide():
    """Two apps attached to one engine each type a prompt: both are served (each process
    counted you-1 before, and the engine refused the second while the first was live)."""
    first = live_source(scenario="shared-prefix", concurrency=1, in_process=False,
                        paused=True)
    try:
        live = first.submit("the first viewer's", sampling={"max_tokens": 4})
        code = textwrap.dedent(f"""
            from roseplay.workload.source import start_live
            src = start_live({{}}, connect={first.loop.address!r})
            try:
                rid = src.submit("the second viewer's", sampling={{"max_tokens": 2}})
                src.resume()
                out = src.own._streams[rid].result(timeout=60)
                print(rid, out.outputs[0].finish_reason, out.error)
            finally:
                src.close()
        """)
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120)
        rid, reason, error = run.stdout.split(maxsplit=2)
        assert (reason, error.strip()) == ("length", "None"), run.stdout + run.stderr
        assert rid.startswith(own_prompts.OWN_PREFIX) and rid != live
        assert live == own_prompts.own_request_id(1)
        assert first.own._streams[live].result(timeout=60).outputs[0].finish_reason == "length"
    finally:
        first.close()


def test_a_typed_prompt_keeps_you_in_the_narrow_id_column():
    """The 7-wide id column shows a typed prompt's `you` and number, not its tag: the end
    alone (`…kqf-1`) read like the workload's `w0kqf-1`."""
    from roseplay.tui.widgets.request_ids import short_id
    tag = PROCESS_TAG
    assert own_prompts.own_request_id(12) == f"you-{tag}-12"
    assert short_id(own_prompts.own_request_id(12), 7) == "you…-12"
    assert short_id(own_prompts.own_request_id(3), 6) == "you…-3"    # "{" before it
    assert short_id(own_prompts.own_request_id(3), 9) == f"you-{tag}-3"
    assert short_id(f"w0{tag}-12", 7) == f"…{tag}-12"                  # the workload's
