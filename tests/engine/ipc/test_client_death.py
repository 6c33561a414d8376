"""A client of the engine process SIGKILLed while its requests hold every kind of state
(grammars, seeded generators, logprobs, blocks in both tiers, swapped-out requests, a
pause), beside another client's requests: after client_timeout the engine ends the dead
client's requests with an error and its pause; the other client's requests finish with
the tokens they get alone; and nothing of the dead client stays: no block or host block
used, no request, no grammar."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from engine import SamplingParams
from engine.codes import CANCELLED, ERROR, FINISHED
from engine.commands import ResetPrefixCache
from engine.front.client import EngineClient
from tests.helpers import wait_for

pytestmark = pytest.mark.timeout(300)
ENDED = (FINISHED, CANCELLED, ERROR)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PROMPTS = ["ROMEO.\nWho art thou?\n\nJULIET.\n", "KING HENRY.\nSpeak, what news?\n\n",
           "HAMLET.\nTo be, or not to be, that is", "First Citizen:\nBefore we proceed"]
SURVIVORS = [SamplingParams(max_tokens=40, temperature=0, ignore_eos=True),
             SamplingParams(max_tokens=40, temperature=1.0, seed=7, ignore_eos=True),
             SamplingParams(max_tokens=30, temperature=0, logprobs=2, ignore_eos=True),
             SamplingParams(max_tokens=30, temperature=0,
                            structured_outputs={"regex": "[a-d]{1,3}(,[0-9]{1,2}){0,8}"})]
DOOMED = textwrap.dedent("""
    import sys
    from engine import SamplingParams
    from engine.front.client import EngineClient
    c = EngineClient(connect=sys.argv[1], label="doomed")
    kinds = [dict(temperature=0), dict(temperature=1.0, seed=3, logprobs=3),
             dict(temperature=0, presence_penalty=0.5),
             dict(temperature=0, structured_outputs={"json": {"type": "array",
                                                              "items": {"type": "integer"}}})]
    streams = [c.submit(p, SamplingParams(max_tokens=300, ignore_eos=True, **kinds[i % 4]),
                        request_id=f"doomed-{i}")
               for i, p in enumerate(sys.argv[2:] * 2)]
    streams[0].get(timeout=120)      # running: the rest admitted or queued behind it
    c.pause()                        # its pause, held until the engine drops it: from here
    print("HOLDING", flush=True)     # the engine steps only when this client says so
    sys.stdin.readline()
    for _ in range(24):              # the survivors run beside its requests, which a
        c.step_once().wait(60)       # loaded machine cannot let end before the kill
    print("STEPPED", flush=True)
    sys.stdin.readline()
""")


def test_a_killed_clients_state_is_released_and_others_keep_their_tokens():
    with EngineClient(model="default", device="cpu", num_blocks=64, block_size=8,
                      max_num_batched_tokens=16, max_num_seqs=6, kv_offloading_size=0.01,
                      preemption_mode="swap", client_timeout=3.0, label="survivor") as owner:
        alone = [owner.submit(p, sp).result(timeout=120).outputs[0].token_ids
                 for p, sp in zip(PROMPTS, SURVIVORS)]
        proc = subprocess.Popen([sys.executable, "-c", DOOMED, owner.address, *PROMPTS],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                cwd=ROOT)
        try:
            assert proc.stdout.readline().strip() == "HOLDING"
            streams = [owner.submit(p, sp) for p, sp in zip(PROMPTS, SURVIVORS)]
            wait_for(lambda: all(owner.snapshot().request(s.request_id) is not None
                                 for s in streams), what="the survivors reached the engine")
            proc.stdin.write("\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == "STEPPED"
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.wait(30)
        outs = [s.result(timeout=120) for s in streams]   # the pause ends with the client
        assert [o.outputs[0].token_ids for o in outs] == alone
        doomed = [f"doomed-{i}" for i in range(2 * len(PROMPTS))]

        def ended():
            views = [owner.snapshot().request(r) for r in doomed]
            return views if all(v is not None and v.state in ENDED for v in views) else None
        views = wait_for(ended, what="the dead client's requests ended")
        states = [v.state for v in views]     # ended by the drop, or done before it
        assert set(states) <= {ERROR, FINISHED} and ERROR in states, states
        assert all("client_timeout" in v.error for v in views if v.state == ERROR)
        owner.send_command(ResetPrefixCache())
        assert owner.wait_idle(30)
        snap = owner.snapshot()
        assert snap.num_used == 0 and not snap.host_block_refcount.any()
        assert all(r.state in ENDED for r in snap.requests), [r.state for r in snap.requests]
        assert not snap.paused
