"""Single steps (CoreLoop's StepOnce: a client's `step_once()`) when another client
resumes the engine before the step ran: the resumed engine steps, and that step answers
every single step asked for meanwhile (before, their answers waited for the next pause
and single step: the asking client's `step_once().wait()` hung)."""
import threading
import time

from engine.commands import SetPaused, StepOnce
from engine.config import make_config
from engine.core.core import LLMEngine
from engine.core.core_loop import CoreLoop
from engine.outputs import CoreRequest
from engine.request import SamplingParams


def test_a_single_step_asked_for_before_a_resume_is_answered():
    engine = LLMEngine(make_config(model="dummy:tiny", device="cpu", num_blocks=64))
    core = CoreLoop(engine, lambda out: None)
    answered = threading.Event()
    # queued together before the loop runs: one client pauses and asks for a step,
    # another resumes before the loop took them
    core.post(CoreRequest("r", (1, 2, 3), SamplingParams(max_tokens=40, temperature=0),
                          time.perf_counter()))
    core.post(SetPaused(True))
    core.post(StepOnce(), lambda _: answered.set())
    core.post(SetPaused(False))
    thread = threading.Thread(target=core.run, daemon=True)
    thread.start()
    try:
        assert answered.wait(30), "the single step was never answered"
        assert core.wait_idle(30) and not engine.requests
    finally:
        core.stop()
        thread.join(30)
