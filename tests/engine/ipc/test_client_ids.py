"""Default request ids of clients in different processes attached to one engine: each
client's are unique across processes, so one client's request is never refused because
another's live request took its id (before, every process counted from req-0, and the
engine refused the second req-0 as a duplicate while the first ran)."""
import subprocess
import sys
import textwrap

from engine import SamplingParams
from engine.front.client import EngineClient


def test_default_ids_of_two_processes_do_not_collide():
    with EngineClient(model="dummy:tiny", device="cpu", num_blocks=64, label="first") as first:
        live = first.submit({"prompt_token_ids": [1, 2, 3]},
                            SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
        first.pause()                  # its request stays live meanwhile
        code = textwrap.dedent(f"""
            from engine import SamplingParams
            from engine.front.client import EngineClient
            with EngineClient(connect={first.address!r}, label="second") as c:
                s = c.submit({{"prompt_token_ids": [4, 5]}},
                             SamplingParams(max_tokens=2, temperature=0))
                c.resume()
                out = s.result(timeout=60)
                print(out.request_id, out.outputs[0].finish_reason, out.error)
        """)
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120)
        rid, reason, error = run.stdout.split(maxsplit=2)
        assert (reason, error.strip()) == ("length", "None"), run.stdout + run.stderr
        assert rid != live.request_id
        assert live.result(timeout=60).outputs[0].finish_reason == "length"
