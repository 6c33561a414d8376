"""wait_idle of one client while another client's pause holds a request (engine/front/api.py
EngineAPI.wait_idle): idle means no step to run, not every request finished, so it
returns True with the request still unfinished, and the snapshot it leaves shows the
pause and that request waiting; after the resume it runs to the end. (Its docstring said
"no request is unfinished", which a paused engine never reached.)"""
import pytest

from engine import SamplingParams
from engine.codes import CANCELLED, ERROR, FINISHED
from engine.front.client import EngineClient

pytestmark = pytest.mark.timeout(180)
TIMEOUT = 60


def test_wait_idle_returns_while_another_clients_pause_holds_a_request():
    with EngineClient(model="dummy:tiny", device="cpu", num_blocks=64, label="pauser") as pauser, \
            EngineClient(connect=pauser.address, label="watcher") as watcher:
        pauser.pause()
        held = pauser.submit({"prompt_token_ids": [1, 2, 3]},
                             SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
        assert pauser.wait_idle(TIMEOUT)            # its pause and submit applied
        assert watcher.wait_idle(TIMEOUT)           # idle: paused, the request unfinished
        snap = watcher.snapshot()
        assert snap.paused and snap.request(held.request_id).state == "waiting"
        pauser.resume()
        assert held.result(timeout=TIMEOUT).outputs[0].finish_reason == "length"
        assert watcher.wait_idle(TIMEOUT)
        snap = watcher.snapshot()
        assert not snap.paused and all(r.state in (FINISHED, CANCELLED, ERROR)
                                     for r in snap.requests)
