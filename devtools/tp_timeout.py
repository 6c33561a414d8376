"""A hard timeout for GPU runs of tensor parallel (tests, scripts): a collective whose
peer never comes hangs instead of failing, so after `seconds` print where every thread of
this process and of its worker processes stands, kill the workers (the exit skips the
usual cleanup, and an orphan would keep its GPU), then exit (rc 1) rather than hang.

Workers print their stacks on SIGUSR1 (faulthandler.register in worker_main)."""
from __future__ import annotations

import faulthandler
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from typing import Callable

WORKER_DUMP_LEAD_S = 3.0   # workers dump first, while this process still waits
WORKER_DUMP_S = 1.0        # time they get to print before they are killed


def exit_with_stacks_after(seconds: float) -> Callable[[], None]:
    """Arm the timeout; returns the function that disarms it."""
    def dump_workers():
        print(f"roseplay: hard timeout ({seconds:.0f} s): stacks of every rank follow",
              file=sys.stderr, flush=True)
        children = mp.active_children()
        for sig in (signal.SIGUSR1, signal.SIGKILL):
            for child in children:
                try:
                    os.kill(child.pid, sig)
                except ProcessLookupError:
                    pass
            time.sleep(WORKER_DUMP_S if sig == signal.SIGUSR1 else 0)
    timer = threading.Timer(max(0.0, seconds - WORKER_DUMP_LEAD_S), dump_workers)
    timer.daemon = True
    timer.start()
    faulthandler.dump_traceback_later(seconds, exit=True)

    def cancel():
        timer.cancel()
        faulthandler.cancel_dump_traceback_later()
    return cancel
