"""How the TUI starts its source and how it ends: the model load and exit signals.

The load runs on a daemon thread of its own, not a Textual thread worker: those run in
asyncio's default executor, whose threads the interpreter joins at exit, so quitting
during a 10 s model load used to wait for the load to end (and could abort in a
finalizer). A load that finishes after the app has gone closes what it built. The thread
ends with the load: the engine process it starts is forked from a thread that lives as
long as the process (engine/ipc/launch.py spawn), so its PR_SET_PDEATHSIG outlives it.

SIGTERM and SIGHUP end the app through its normal exit (Textual's driver then leaves the
alternate screen, turns mouse tracking off and shows the cursor); the default action
would kill the process with the terminal still in the app's modes.
"""
from __future__ import annotations

import asyncio
import os
import signal
import threading
from typing import Callable

from textual.message import Message

EXIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
EXIT_GRACE_S = 3.0      # after an exit signal: the normal exit's time, then a hard exit


class SourceLoaded(Message):
    """The background load ended: `source` is set, or `error` says why not."""

    def __init__(self, source=None, error: BaseException | None = None):
        super().__init__()
        self.source = source
        self.error = error


def start_loading(app, factory: Callable[[], object]) -> threading.Thread:
    """Run `factory` on a daemon thread; post SourceLoaded to `app` when it returns."""
    def load() -> None:
        try:
            msg = SourceLoaded(source=factory())
        except Exception as exc:       # shown by the CLI as one line
            msg = SourceLoaded(error=exc)
        if not app.is_running or not app.post_message(msg):
            if msg.source is not None:      # the user quit meanwhile: nobody will use it
                msg.source.close()
    thread = threading.Thread(target=load, name="roseplay-load", daemon=True)
    thread.start()
    return thread


def install_exit_signals(app, on_signal: Callable[[int], None]) -> bool:
    """Route SIGTERM/SIGHUP to `on_signal(signum)` on the app's event loop (main thread
    only: a headless test app in a worker thread keeps the process's handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    loop = asyncio.get_running_loop()
    for sig in EXIT_SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)
    return True


def remove_exit_signals() -> None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    for sig in EXIT_SIGNALS:
        loop.remove_signal_handler(sig)


def exit_watchdog(code: int, grace: float = EXIT_GRACE_S) -> None:
    """End the process with `code` if it is still alive `grace` s from now (a daemon timer:
    a normal exit ends the interpreter first and the timer with it)."""
    timer = threading.Timer(grace, os._exit, (code,))
    timer.daemon = True
    timer.start()


def error_line(exc: BaseException) -> str:
    """`Type: message` once: an engine process's error arrives with its type already
    in the message ("InvalidRequestError: ...")."""
    name, text = type(exc).__name__, str(exc).strip()
    if not text:
        return name
    return text if text.startswith(f"{name}:") else f"{name}: {text}"
