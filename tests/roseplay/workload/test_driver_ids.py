"""Workload drivers in two processes attached to one engine process (two `roseplay
--connect`, a TUI and `roseplay bench`): each one's request ids are its own, so neither
one's requests are refused because the other's live requests took their ids (before,
every process's first driver named its requests w0-0, w0-1 ..., and the engine refused
the second process's as duplicates while the first's were live)."""
import itertools
import subprocess
import sys
import textwrap

import pytest

from engine.front.client import EngineClient
from roseplay.workload import driver as driver_mod
from roseplay.workload import scenarios as sc

pytestmark = pytest.mark.timeout(300)
N = 6
WORKLOAD = dict(input_len=8, output_len=3)

OTHER = """
    import time
    from engine.front.client import EngineClient
    from roseplay.workload import scenarios as sc
    from roseplay.workload.driver import WorkloadDriver
    with EngineClient(connect={address!r}, label="second") as c:
        items = sc.build_workload("random", {n}, vocab_size=c.info.vocab_size, seed=1,
                                  **{workload!r})
        d = WorkloadDriver(c, items, num_requests={n}).start()
        deadline = time.monotonic() + 60
        while d.submitted < {n} and time.monotonic() < deadline:
            time.sleep(0.01)
        c.resume()             # the first process's requests were live until now
        assert d.wait(120), "the second driver never finished"
        print(d.id_prefix, d.completed, d.failed, d.submit_errors[:1],
              [o.error for o in d.outputs if o.error][:1])
"""


def test_drivers_of_two_processes_run_to_the_end(monkeypatch):
    monkeypatch.setattr(driver_mod, "_DRIVER_IDS", itertools.count())   # as a fresh process's
    with EngineClient(model="dummy:tiny", device="cpu", num_blocks=64, label="first") as first:
        first.pause()          # its requests stay live while the other process submits
        items = sc.build_workload("random", N, vocab_size=first.info.vocab_size, **WORKLOAD)
        mine = driver_mod.WorkloadDriver(first, items, num_requests=N).start()
        try:
            code = textwrap.dedent(OTHER.format(address=first.address, n=N, workload=WORKLOAD))
            run = subprocess.run([sys.executable, "-c", code], capture_output=True,
                                 text=True, timeout=240)
            assert run.returncode == 0, run.stdout + run.stderr
            prefix, completed, failed, rest = run.stdout.split(maxsplit=3)
            assert (completed, failed) == (str(N), "0"), run.stdout
            assert mine.wait(120) and (mine.completed, mine.failed) == (N, 0), mine.submit_errors
            assert prefix.startswith("w0") and mine.id_prefix.startswith("w0")
            assert prefix != mine.id_prefix
        finally:
            mine.stop()
