"""EngineLaunch: an engine-core process on its way up (spawned, not yet ready).

Split from EngineClient so that several engines can load at once (`roseplay --compare`
spawns both processes, then waits for each): a launch owns the process, its private
socket directory and its status pipe until a client takes it over.
"""
from __future__ import annotations

import atexit
import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
import weakref

from engine.config import InvalidRequestError, make_config
from engine.ipc import auth
from engine.ipc import protocol as P
from engine.ipc.leftovers import OwnedDir


def child_env() -> dict:
    """The engine process finds this package even when it is not installed (a checkout)."""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")    # idle OpenMP threads sleep, not spin
    return env


# the engine processes started here -> the pid that started them (a forked child's exit
# leaves its parent's alone)
_started: "weakref.WeakKeyDictionary[subprocess.Popen, int]" = weakref.WeakKeyDictionary()


@atexit.register
def _stop_started() -> None:
    """At this process's exit, each engine process it started that still runs (its front
    never closed) gets SIGCONT and SIGTERM: one stopped (SIGSTOP, a debugger) would hold
    its parent's-death signal until continued, outliving its owner and holding the
    owner's stdout, so that a parent reading it waited forever."""
    for proc, owner in list(_started.items()):
        if owner == os.getpid() and proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGCONT)
                proc.terminate()
            except OSError:
                pass


_spawns: queue.SimpleQueue | None = None
_spawns_lock = threading.Lock()


def spawn(start):
    """`start()` (it starts a process) on a thread that lives as long as this process:
    the main thread, else one kept for it. An engine process asks Linux to stop it when
    its parent dies (PR_SET_PDEATHSIG, engine/ipc/proc_setup.py), and Linux means the
    thread that forked it: an engine started from a caller's short-lived thread (a
    worker, a notebook's executor) got SIGTERM as soon as that thread returned."""
    global _spawns
    if threading.current_thread() is threading.main_thread():
        return start()
    with _spawns_lock:
        if _spawns is None:
            _spawns = queue.SimpleQueue()
            threading.Thread(target=_spawn_loop, args=(_spawns,), name="roseplay-spawn",
                             daemon=True).start()
    done, box = threading.Event(), []
    _spawns.put((start, box, done))
    done.wait()
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def _spawn_loop(jobs: queue.SimpleQueue) -> None:
    while True:
        start, box, done = jobs.get()
        try:
            box.append(start())
        except BaseException as exc:      # raised again in the caller's thread
            box.append(exc)
        done.set()


class EngineDied(RuntimeError):
    """The engine-core process is gone."""


class EngineLaunch:
    def __init__(self, engine_kwargs: dict, address: str | None = None,
                 engine_key: str | None = None, env: dict | None = None):
        """Check the knobs and the address (a bad one is refused before any process
        starts), then start `python -m engine.ipc.core_proc` (a subprocess, not
        multiprocessing: nothing of the caller's __main__ re-runs). engine_key: the key
        clients must show (default: $ROSEPLAY_ENGINE_KEY, else a random one); env:
        variables set for the engine process (a replica's CUDA_VISIBLE_DEVICES)."""
        self.config = make_config(**engine_kwargs)
        given = auth.given_key(engine_key)
        if address is not None:
            try:
                P.endpoints(address)
            except ValueError as exc:
                raise InvalidRequestError(str(exc)) from None
            auth.check_bind(address, key_given=given is not None)
        self.engine_key = given or auth.new_key()
        self.tmpdir: OwnedDir | None = None
        if address is None:    # a private folder; one a killed owner left goes at a start
            self.tmpdir = OwnedDir("roseplay-")
            address = f"ipc://{self.tmpdir.path}/engine"
        self.address = address
        read_fd, write_fd = os.pipe()
        cmd = [sys.executable, "-m", "engine.ipc.core_proc", "--address", address,
               "--engine-json", json.dumps(engine_kwargs), "--owner-pid", str(os.getpid()),
               "--status-fd", str(write_fd)]
        self.owner_token = uuid.uuid4().hex     # only the owner may stop it
        env = {**child_env(), **(env or {})}
        env["ROSEPLAY_OWNER_TOKEN"] = self.owner_token
        env[auth.ENGINE_KEY_ENV] = self.engine_key      # the environment: not seen in ps
        try:
            self.proc = spawn(lambda: subprocess.Popen(
                cmd, pass_fds=(write_fd,), stdin=subprocess.DEVNULL, env=env))
            _started[self.proc] = os.getpid()
        except BaseException:
            os.close(read_fd)
            self._remove_dir()
            raise
        finally:
            os.close(write_fd)
        self.status = os.fdopen(read_fd, "rb", buffering=0)   # unbuffered: select() sees lines

    def abort(self) -> None:
        """Never taken over: stop the process, remove its directory."""
        self.status.close()
        stop_engine(self.proc, self.tmpdir, self.address)
        self.tmpdir = None

    def _remove_dir(self) -> None:
        stop_engine(None, self.tmpdir)
        self.tmpdir = None


def stop_engine(proc: subprocess.Popen | None, tmpdir: OwnedDir | None,
                address: str | None = None) -> None:
    """SIGTERM (SIGKILL after 2 s) the engine process if it runs; remove its socket
    folder, and its key file if the engine could not (it was killed)."""
    try:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(2.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(2.0)
    finally:
        if tmpdir is not None:
            tmpdir.remove()
        elif address is not None:
            auth.remove_stale_key(address)


def wait_ready(proc: subprocess.Popen, status, on_progress, timeout: float) -> None:
    """Read the engine process's status lines until it is ready (closes `status`)."""
    deadline = time.monotonic() + timeout
    try:
        while True:
            if time.monotonic() > deadline:
                raise EngineDied(f"engine process not ready after {timeout:.0f} s")
            if not select.select([status], [], [], 0.2)[0]:
                if proc.poll() is not None:
                    raise EngineDied(f"engine process exited during start-up "
                                     f"(code {proc.returncode})")
                continue
            line = status.readline()
            if not line:
                proc.wait(5)
                raise EngineDied(f"engine process exited during start-up "
                                 f"(code {proc.returncode})")
            msg = json.loads(line.decode())
            if msg["kind"] == "ready":
                return
            if msg["kind"] == "error":
                raise InvalidRequestError(msg["text"])
            if on_progress is not None:
                on_progress(msg["text"])
    finally:
        status.close()
