"""Run the app under uvicorn: in the foreground (the CLI) or on a thread (tests, and the
TUI attach that `serve --tui` will use: the server on a thread, the app in front).

The socket is bound here (127.0.0.1 unless told otherwise; port 0 picks a free one)
before uvicorn starts, so the caller knows the port at once. Stopping (SIGTERM, Ctrl-C,
stop()) closes the listening socket, drains the open generations for the app's
shutdown_timeout, ends the rest with an error event (shutdown.py), then lets uvicorn
close the connections. If the engine dies the server reports it and stops the same way,
with `exit_code` EXIT_ENGINE_DIED so that a supervisor restarts it.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import logging
import os
import socket
import threading
import time

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from roseplay.serve.shutdown import EXIT_CUT, EXIT_DRAINED, EXIT_ENGINE_DIED

DEFAULT_HOST = "127.0.0.1"
FLUSH_S = 2.0          # after the drain: time for cut streams to write their last events
STOP_MARGIN_S = FLUSH_S * 2 + 5     # past the drain: uvicorn's own shutdown, the engine's stop
logger = logging.getLogger("roseplay.serve")


class _ReadTimeout:
    """A request-read timeout for uvicorn's HTTP protocols: a connection that has not
    sent a whole request (headers and body) within `read_timeout` seconds of opening,
    or of its previous response, is closed (slow-loris clients hold no socket for long).
    uvicorn's own keep-alive timeout still closes idle connections sooner."""

    def __init__(self, *args, read_timeout: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.read_timeout, self._read_timer = read_timeout, None

    def _arm(self) -> None:
        self._disarm()
        self._read_timer = self.loop.call_later(self.read_timeout, self._read_timed_out)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _request_in(self) -> bool:
        raise NotImplementedError

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if not self._request_in() and not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def timeout_keep_alive_handler(self) -> None:
        """uvicorn's keep-alive close, unless a request already waits in the socket: after
        a stall of this process longer than the timeout (SIGSTOP, swapping) the timer
        fired before the loop read the client's next request, which got a reset."""
        if not _has_unread_bytes(self.transport):
            super().timeout_keep_alive_handler()


class HttpToolsReadTimeoutProtocol(_ReadTimeout, HttpToolsProtocol):
    """uvicorn's httptools (llhttp) protocol with the read timeout: the default, about
    two thirds of the server's CPU per request that h11's pure-Python parser costs
    (docs/SERVE.md "Admission")."""

    def _request_in(self) -> bool:
        """The newest request is read whole and not yet answered (a pipelined one is
        queued by uvicorn, so an earlier one is then in too)."""
        cycle = self.cycle
        return cycle is not None and not cycle.more_body and not cycle.response_complete

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()             # the request is in

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and not self._request_in():
            self._arm()            # waiting for the next request (or the rest of its body)


class H11ReadTimeoutProtocol(_ReadTimeout, H11Protocol):
    """uvicorn's h11 protocol with the read timeout (`serve --http h11`)."""

    def _request_in(self) -> bool:
        return self.conn.their_state is h11.DONE

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE and self.conn.their_state is not \
                h11.SEND_BODY:
            self._disarm()         # the request is in (or the connection is ending)

    def on_response_complete(self) -> None:
        self._arm()
        super().on_response_complete()


PROTOCOLS = {"httptools": HttpToolsReadTimeoutProtocol, "h11": H11ReadTimeoutProtocol}


def _has_unread_bytes(transport) -> bool:
    fileno = getattr(transport.get_extra_info("socket"), "fileno", None)
    if fileno is None:
        return False
    try:
        with socket.socket(fileno=os.dup(fileno())) as sock:
            return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except OSError:            # BlockingIOError: nothing there; others: let uvicorn close
        return False


def _unsent(connections) -> int:
    """Connections whose response bytes wait in the transport's buffer (their clients
    read slower than the server wrote): the process exiting would drop them."""
    return sum(1 for c in connections
               if (t := getattr(c, "transport", None)) is not None and t.get_write_buffer_size())


def url(host: str, port: int) -> str:
    """http://host:port, an IPv6 host in brackets."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def bind(host: str = DEFAULT_HOST, port: int = 0, reuse_port: bool = False) -> socket.socket:
    """The listening socket; reuse_port: one address that several API-server processes
    bind, the kernel spreading connections over them (multiproc.py)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _config(app, log_level: str) -> uvicorn.Config:
    # lifespan off: the app holds no resources of its own (the engine belongs to the caller);
    # proxy_headers off: nothing reads the client's address, and it is one ASGI layer less
    cfg = app.state.serve.config
    protocol = functools.partial(PROTOCOLS[cfg.http], read_timeout=cfg.timeout_request_read)
    return uvicorn.Config(app, log_level=log_level, lifespan="off", access_log=False,
                          http=protocol, proxy_headers=False,
                          timeout_keep_alive=cfg.timeout_keep_alive,
                          timeout_graceful_shutdown=FLUSH_S, backlog=2048)


class Server(uvicorn.Server):
    """uvicorn with a drain before its own shutdown, and a watch on the engine."""

    def __init__(self, app, log_level: str, watch=None, on_stop=None):
        """watch() -> (exit code, reason) or None, checked every tick (a process of the
        group gone: multiproc.py); on_stop(force) runs as the shutdown begins (False)
        and at a second Ctrl-C (True: skip the drain)."""
        super().__init__(_config(app, log_level))
        self.serve_state = app.state.serve
        self.exit_code = EXIT_DRAINED
        self.engine_error: str | None = None
        self.watch, self.on_stop = watch, on_stop

    async def on_tick(self, counter: int) -> bool:
        if self.engine_error is None and (err := self.serve_state.engine_error()):
            self.engine_error = err
            self.exit_code = EXIT_ENGINE_DIED
            logger.error("roseplay serve: the engine failed (%s); stopping", err)
            self.should_exit = True
        elif self.watch is not None and (failed := self.watch()):
            self.exit_code, reason = failed
            logger.error("roseplay serve: %s; stopping", reason)
            self.should_exit = True
        return await super().on_tick(counter)

    def handle_exit(self, sig, frame) -> None:
        super().handle_exit(sig, frame)
        if self.force_exit and self.on_stop is not None:
            self.on_stop(True)

    async def shutdown(self, sockets=None) -> None:
        if self.on_stop is not None:
            self.on_stop(False)
        for server in self.servers:          # stop accepting: new connections are refused
            server.close()
        for sock in sockets or []:
            sock.close()
        drain = self.serve_state.drain
        drain.begin()
        timeout = 0 if self.force_exit else self.serve_state.config.shutdown_timeout
        # a SIGTERM to the whole group (systemd, `timeout`) reached the engine process
        # too: it serves the drain when told of it (engine/ipc/core_proc.py)
        self.serve_state.loop.draining(timeout + STOP_MARGIN_S)
        unsent = lambda: _unsent(self.server_state.connections)     # noqa: E731
        if not await drain.wait(timeout, lambda: self.force_exit, unsent):
            n, cut_writes = drain.cut(), unsent()
            logger.warning("roseplay serve: drain time (%s s) over; ended %d open "
                           "request(s) with an error", timeout, n)
            if cut_writes:      # uvicorn closes them with what their clients did not read
                drain.cut_count += cut_writes
                logger.warning("roseplay serve: %d response(s) not read by their clients "
                               "in the drain time are cut", cut_writes)
        if drain.cut_count and self.exit_code == EXIT_DRAINED:
            self.exit_code = EXIT_CUT
        await super().shutdown(sockets)      # waits up to FLUSH_S for the last writes

    @contextlib.contextmanager
    def capture_signals(self):
        """As uvicorn's, without re-raising SIGTERM afterwards: the exit code is ours."""
        with super().capture_signals():
            yield
            self._captured_signals.clear()


class ServerThread:
    """uvicorn on a daemon thread; `url` is the base URL (http://host:port)."""

    def __init__(self, app, host: str = DEFAULT_HOST, port: int = 0, log_level: str = "warning"):
        self.app = app
        self._sock = bind(host, port)
        self.host, self.port = self._sock.getsockname()[:2]
        self.server = Server(app, log_level)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]},
                                        name="roseplay-serve", daemon=True)

    @property
    def url(self) -> str:
        return url(self.host, self.port)

    def start(self, timeout: float = 30.0) -> "ServerThread":
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float | None = None) -> None:
        if timeout is None:
            timeout = self.app.state.serve.config.shutdown_timeout + STOP_MARGIN_S
        self.server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._sock.close()

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# Python's default (700, 10, 10) ran a young collection every ~3 requests of a burst,
# each walking every live request's tasks, futures and frames again: ~18 % of the event
# loop's busy samples at 256 in flight (docs/SERVE.md "Admission")
GC_THRESHOLDS = (50_000, 20, 100)


def tune_gc() -> None:
    """Fewer collections while serving; the startup heap (imports, tokenizer, app) is
    frozen, so the full collections skip it (as vLLM's API server does)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def serve_forever(app, host: str, port: int, log_level: str = "info", sock=None,
                  watch=None, on_stop=None) -> int:
    """The CLI: uvicorn in the foreground until SIGTERM or Ctrl-C (uvicorn takes the
    signals); returns the exit code (shutdown.py: drained, cut, or the engine died).
    sock: a socket bound already (SO_REUSEPORT, multiproc.py); watch, on_stop: Server's."""
    sock = sock or bind(host, port)
    server = Server(app, log_level, watch, on_stop)
    tune_gc()
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    return server.exit_code
