"""Run the app under uvicorn: in the foreground (the CLI) or on a thread (tests, and the
TUI attach that `serve --tui` will use: the server on a thread, the app in front).

The socket is bound here (127.0.0.1 unless told otherwise; port 0 picks a free one)
before uvicorn starts, so the caller knows the port at once. Stopping asks uvicorn to
exit, waits a bounded time for open streams, and joins the thread.
"""
from __future__ import annotations

import socket
import threading
import time

import uvicorn

DEFAULT_HOST = "127.0.0.1"
GRACEFUL_SHUTDOWN_S = 3


def bind(host: str = DEFAULT_HOST, port: int = 0) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _config(app, log_level: str) -> uvicorn.Config:
    # lifespan off: the app holds no resources of its own (the engine belongs to the caller)
    return uvicorn.Config(app, log_level=log_level, lifespan="off", access_log=False,
                          timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S, backlog=2048)


class ServerThread:
    """uvicorn on a daemon thread; `url` is the base URL (http://host:port)."""

    def __init__(self, app, host: str = DEFAULT_HOST, port: int = 0, log_level: str = "warning"):
        self.app = app
        self._sock = bind(host, port)
        self.host, self.port = self._sock.getsockname()[:2]
        self.server = uvicorn.Server(_config(app, log_level))
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]},
                                        name="roseplay-serve", daemon=True)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout: float = 30.0) -> "ServerThread":
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = GRACEFUL_SHUTDOWN_S + 5) -> None:
        self.server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._sock.close()

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def serve_forever(app, host: str, port: int, log_level: str = "info") -> None:
    """The CLI: uvicorn in the foreground until Ctrl-C (uvicorn handles the signals)."""
    sock = bind(host, port)
    try:
        uvicorn.Server(_config(app, log_level)).run(sockets=[sock])
    finally:
        sock.close()
