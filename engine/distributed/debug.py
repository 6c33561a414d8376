"""A hard timeout for GPU runs of tensor parallel (tests, scripts): a collective whose
peer never comes hangs instead of failing, so after `seconds` print where every thread of
this process and of its worker processes stands, then exit (rc 1) rather than hang.

Workers print their stacks on SIGUSR1 (faulthandler.register in worker_main)."""
from __future__ import annotations

import faulthandler
import multiprocessing as mp
import os
import signal
import sys
import threading
from typing import Callable

WORKER_DUMP_LEAD_S = 3.0   # workers dump first, while this process still waits


def exit_with_stacks_after(seconds: float) -> Callable[[], None]:
    """Arm the timeout; returns the function that disarms it."""
    def dump_workers():
        print(f"roseplay: hard timeout ({seconds:.0f} s): stacks of every rank follow",
              file=sys.stderr, flush=True)
        for child in mp.active_children():
            try:
                os.kill(child.pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
    timer = threading.Timer(max(0.0, seconds - WORKER_DUMP_LEAD_S), dump_workers)
    timer.daemon = True
    timer.start()
    faulthandler.dump_traceback_later(seconds, exit=True)

    def cancel():
        timer.cancel()
        faulthandler.cancel_dump_traceback_later()
    return cancel
