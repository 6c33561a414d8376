"""`roseplay serve --api-server-count N`: N API-server processes on one engine process.

Why: one server process admits requests one by one and spends ~28 us of its CPU per
streamed token (docs/SERVE.md "Performance"); its GIL, not the engine, caps W1 over
HTTP. As vLLM's `--api-server-count`, the serve process starts the engine once and is
API server 0; it then starts N-1 more (`python -m roseplay.serve.multiproc`, a fresh
interpreter, not a fork), each an EngineClient attached to the engine's address and the
same FastAPI app. Every process binds its own socket on host:port with SO_REUSEPORT, so
the kernel spreads new connections over them.

- Secrets never go on a command line: the engine key and --api-key travel in the
  child's environment ($ROSEPLAY_ENGINE_KEY, $ROSEPLAY_API_KEY).
- /metrics: prometheus_client's multiprocess mode in a private 0700 directory (removed
  at exit; one that a killed serve process left is removed by the next start:
  engine/ipc/leftovers.py), so any process's /metrics sums every process's histograms
  and counters;
  `roseplay:api_server_requests_total{api_server}` says which process served what.
- Shutdown: SIGTERM/Ctrl-C to the serve process is passed on once to every API server
  (each in its own process group, so a terminal's Ctrl-C reaches them only this way; a
  second Ctrl-C goes on as SIGINT, which skips their drain too);
  each drains for --shutdown-timeout; the engine stops after the last one exits. An API
  server that dies makes the serve process stop the rest and exit EXIT_API_SERVER_DIED.
  Each API server watches the engine and the serve process (pidfd): if either goes, its
  open streams end with an error event and [DONE] and it exits EXIT_ENGINE_DIED. Stalls
  follow the one policy of engine/ipc/attach.py (client_timeout), as for API server 0.
- Request ids are `<prefix>-<uuid4 hex>`: random per process (os.urandom), so they do
  not collide across processes; the engine refuses a duplicate id anyway.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

from engine.ipc import auth
from engine.ipc.launch import child_env
from engine.ipc.leftovers import OwnedDir
from roseplay.serve.metrics import API_SERVER_INDEX_ENV, MULTIPROC_ENV
from roseplay.serve.shutdown import EXIT_CUT, EXIT_DRAINED, EXIT_ENGINE_DIED
from roseplay.serve.server import bind

API_KEY_ENV = "ROSEPLAY_API_KEY"                    # as `roseplay serve --api-key`'s default
EXIT_API_SERVER_DIED = 5
START_TIMEOUT_S = 300.0     # an API server loads the tokenizer and imports torch


def enable_metrics(path: str, index: int) -> None:
    """Multiprocess metrics for this process: before the app's metrics are built.
    prometheus_client picks its value class from the environment at import, and this
    process imported it already, so the class is switched here too."""
    from prometheus_client import values
    os.environ[MULTIPROC_ENV] = path
    os.environ[API_SERVER_INDEX_ENV] = str(index)
    values.ValueClass = values.MultiProcessValue()


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A listening address several processes bind (the kernel spreads connections)."""
    return bind(host, port, reuse_port=True)


class ApiServerGroup:
    """The serve process's API servers 1..N-1: start, watch, stop, reap. They start
    while this process builds its own app (both import the tokenizer's libraries);
    `wait_ready()` before serving."""

    def __init__(self, count: int, loop, config, host: str, port: int, log_level: str):
        self._metrics = OwnedDir("roseplay-metrics-")       # mode 0700, locked while we run
        self.metrics_dir = self._metrics.path
        self.procs: list[subprocess.Popen] = []
        self._pipes: list = []
        self.stopping = False
        self.died: str | None = None
        enable_metrics(self.metrics_dir, 0)
        try:
            self._start(count, loop, config, host, port, log_level)
        except BaseException:
            self.close()
            raise

    def _start(self, count, loop, config, host, port, log_level) -> None:
        env = child_env()
        env[MULTIPROC_ENV] = self.metrics_dir
        env[auth.ENGINE_KEY_ENV] = loop.transport.engine_key      # the key this process showed
        env.pop(API_KEY_ENV, None)
        if config.api_key:
            env[API_KEY_ENV] = config.api_key
        spec = {"config": {k: v for k, v in dataclasses.asdict(config).items()
                           if k != "api_key"},
                "host": host, "port": port, "log_level": log_level, "address": loop.address,
                "engine_pid": loop.proc.pid, "parent_pid": os.getpid()}
        for index in range(1, count):
            read_fd, write_fd = os.pipe()
            env[API_SERVER_INDEX_ENV] = str(index)
            cmd = [sys.executable, "-m", "roseplay.serve.multiproc", "--spec", json.dumps(spec),
                   "--status-fd", str(write_fd)]
            try:
                self.procs.append(subprocess.Popen(cmd, pass_fds=(write_fd,), env=env,
                                                   stdin=subprocess.DEVNULL, process_group=0))
            finally:
                os.close(write_fd)
            self._pipes.append(os.fdopen(read_fd, "rb", buffering=0))

    def wait_ready(self) -> None:
        """Until every API server listens (RuntimeError if one failed)."""
        try:
            self._wait_ready()
        finally:
            for p in self._pipes:
                p.close()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        waiting = dict(zip(self._pipes, self.procs))
        while waiting:
            ready = select.select(list(waiting), [], [], 0.5)[0]
            for pipe in ready:
                proc = waiting.pop(pipe)
                if pipe.readline().strip() != b"ready":
                    proc.wait(10)
                    raise RuntimeError(f"API server process {proc.pid} failed to start "
                                       f"(exit code {proc.returncode})")
            if time.monotonic() > deadline:
                raise RuntimeError("API server processes did not start in time")

    def check(self) -> tuple[int, str] | None:
        """For the serve process's uvicorn tick: an API server that exited on its own."""
        if self.stopping or self.died:
            return None
        for proc in self.procs:
            if proc.poll() is not None:
                self.died = f"API server process {proc.pid} exited (code {proc.returncode})"
                return EXIT_API_SERVER_DIED, self.died
        return None

    def stop(self, force: bool = False) -> None:
        """Pass the stop on: SIGTERM once (every API server drains on its own); with
        force (a second Ctrl-C here) SIGINT, which makes uvicorn skip the drain there."""
        if self.stopping and not force:
            return
        self.stopping = True
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT if force else signal.SIGTERM)

    def wait(self, own_code: int, timeout: float) -> int:
        """Wait for the API servers (each drains up to --shutdown-timeout); the group's
        exit code: the engine died > an API server died > a drain was cut > drained."""
        self.stop()
        deadline = time.monotonic() + timeout
        codes = [own_code]
        for proc in self.procs:
            try:
                codes.append(proc.wait(max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                codes.append(EXIT_CUT)
        if EXIT_ENGINE_DIED in codes:
            return EXIT_ENGINE_DIED
        if self.died or any(c not in (EXIT_DRAINED, EXIT_CUT) for c in codes):
            return EXIT_API_SERVER_DIED          # killed, or failed in its own way
        return max(codes)

    def close(self) -> None:
        """Nothing left behind: no process, no metrics directory."""
        for p in self._pipes:
            p.close()
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self._metrics.remove()


# -- an API server process (python -m roseplay.serve.multiproc) ------------------------------
def watch_group(loop, engine_pid: int, parent_pid: int) -> None:
    """A thread: the engine or the serve process gone ends every open stream with an
    error event (as an engine death does in the engine's own client). An attached
    client would otherwise notice only after client_timeout of silence."""
    def run():
        fds = {}
        for pid, what in ((engine_pid, "engine process died"),
                          (parent_pid, "the serve process died")):
            try:
                fds[os.pidfd_open(pid)] = what
            except ProcessLookupError:
                loop.transport.die(what)
                return
        ready = select.select(list(fds), [], [])[0]
        loop.transport.die(fds[ready[0]])
    threading.Thread(target=run, name="roseplay-api-server-watch", daemon=True).start()


def api_server_main(argv: list[str] | None = None) -> int:
    """API server 1..N-1: attach to the engine, bind the shared port, say "ready" on the
    status pipe, serve until the serve process says stop (exit codes as serve's)."""
    p = argparse.ArgumentParser(prog="python -m roseplay.serve.multiproc")
    p.add_argument("--spec", required=True, help="JSON: ServeConfig, host, port, address...")
    p.add_argument("--status-fd", type=int, required=True)
    args = p.parse_args(argv)
    spec = json.loads(args.spec)
    status = os.fdopen(args.status_fd, "wb", buffering=0)
    from engine.front.client import EngineClient
    from roseplay.serve.app import ServeConfig, build_app
    from roseplay.serve.server import serve_forever
    cfg = dict(spec["config"], api_key=os.environ.get(API_KEY_ENV) or None)
    cfg["served_model_name"] = tuple(cfg["served_model_name"])
    index = int(os.environ[API_SERVER_INDEX_ENV])
    loop = EngineClient(connect=spec["address"], label=f"server-{index}", snapshots=False)
    try:
        watch_group(loop, spec["engine_pid"], spec["parent_pid"])
        app = build_app(loop, ServeConfig(**cfg))
        sock = reuse_port_socket(spec["host"], spec["port"])
        status.write(b"ready\n")
        status.close()
        return serve_forever(app, spec["host"], spec["port"], spec["log_level"], sock=sock)
    finally:
        loop.close()


if __name__ == "__main__":
    sys.exit(api_server_main())
