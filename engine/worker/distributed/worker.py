"""Tensor-parallel ranks 1..N-1 as worker processes; rank 0 is the engine process.

`TPWorkerGroup` is what rank 0 drives:
    group = TPWorkerGroup(WorkerSpec(...)); tp = group.start()   # spawn + join the group
    loaded = load_model(..., tp=tp)          # rank 0's shard, in the engine process
    group.wait_ready()                       # every worker loaded its shard
    group.allocate_kv(num_blocks, block_size, **runner_kwargs)   # workers build runners
    per step: tokens = group.run(batch, runner.execute_model, released_request_ids)
    group.shutdown()
Each worker builds the engine's own ModelRunner (same graph buckets, so the NCCL
collectives captured in the graphs match rank 0's) and loops: receive a step -> drop the
sampler state of ended requests -> forward + sample (its tokens stay on its device, for
the next continuation step). A watchdog thread watches the workers: a rank that exits
ends the group with a `TPWorkerError` naming it (aborting NCCL so rank 0 never hangs in
a collective), which `check()` and every later call raise; a worker whose engine
process is gone exits at once, even when stuck in a CUDA call.
"""
from __future__ import annotations

import contextlib
import faulthandler
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait

import torch

from engine.worker.distributed.broadcast import ShmBroadcast, TorchBroadcast, TransportError
from engine.worker.distributed.group import (CHILD_ENV, abort_group, bind_device, check_devices,
                                      destroy_group, free_port, init_group, rank_device)
from engine.worker.models.parallel import TPInfo


class TPWorkerError(RuntimeError):
    """A tensor-parallel rank failed or exited: the engine cannot step any more."""


@dataclass(frozen=True)
class WorkerSpec:
    model: str
    size: int
    device_type: str = "cpu"          # cpu (gloo) | cuda (nccl; rank r on cuda:r)
    dtype: str = "float32"
    seed: int = 0
    attention_backend: str = "torch"  # kernels.get_ops name
    transport: str = "shm"            # shm | torch (docs/TP.md: cost per step)
    timeout_s: float = 600.0          # collectives and start-up


@contextlib.contextmanager
def _spawning():
    """While workers start: CHILD_ENV set (they inherit it), and the parent's __main__
    hidden. Spawned children re-run __main__ (a user's script without a
    `__name__ == "__main__"` guard would start another engine); the workers need nothing
    from it, so they start as from an interactive session."""
    main = sys.modules["__main__"]
    saved_main = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    saved_env = {k: os.environ.get(k) for k in CHILD_ENV}
    main.__dict__.pop("__file__", None)
    main.__spec__ = None
    os.environ.update(CHILD_ENV)
    try:
        yield
    finally:
        main.__dict__.update(saved_main)
        for k, v in saved_env.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def _transport(spec: WorkerSpec, group, rank: int, shm, alive):
    """shm: (name, wakeup semaphores) of rank 0's slot, None for the torch transport."""
    if spec.transport == "torch":
        return TorchBroadcast(group, rank)
    name, wakeups = shm
    return ShmBroadcast(name, spec.size - 1, rank, alive=alive, wakeups=wakeups)


def _exit_with_parent(parent) -> None:
    """A daemon thread: when the engine process is gone, exit now. The main thread may be
    blocked in a CUDA call (a collective whose peer died) and never reach the step
    transport's own parent check; an orphan would keep its GPU busy."""
    def watch():
        parent.join()
        os._exit(1)
    threading.Thread(target=watch, name="tp-parent-watch", daemon=True).start()


def worker_main(rank: int, spec: WorkerSpec, port: int, shm: tuple | None, conn) -> None:
    """Entry of a spawned rank: join, load the shard, then serve steps until 'stop'; it
    exits from here (code 0 after a stop, 1 after an error)."""
    transport = runner = None
    faulthandler.register(signal.SIGUSR1, all_threads=True)   # stacks on demand (hangs)
    parent = mp.parent_process()
    _exit_with_parent(parent)
    try:
        from engine.worker.models.loader import load_model
        from engine.worker.runner import ModelRunner
        from kernels import get_ops
        tp = TPInfo(rank, spec.size)
        bind_device(spec.device_type, rank, spec.size)
        conn.send(("joining", None))   # rank 0 joins the rendezvous only once all can
        group = init_group(tp, port, spec.device_type, spec.timeout_s)
        device, dtype = rank_device(spec.device_type, rank), getattr(torch, spec.dtype)
        model = load_model(spec.model, device, dtype, spec.seed, tp).model
        transport = _transport(spec, group, rank, shm, alive=parent.is_alive)
        conn.send(("ready", None))
        while True:
            kind, payload = transport.recv()
            if kind == "stop":
                break
            if kind == "kv":
                runner = ModelRunner(model, get_ops(spec.attention_backend), device, dtype,
                                     **payload)
            elif kind == "xfer":           # copies between the KV tiers, before a step
                runner.transfer_kv(payload)
            elif kind == "rewind":         # the last step's launch failed (on rank 0)
                runner.rewind_draws()
            else:
                batch, released = payload
                runner.release(released)
                runner.execute_model(batch)
    except BaseException as exc:   # report, then exit non-zero: rank 0's watchdog names it
        try:
            conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
        except Exception:
            pass
        _exit_now(1)
    finally:
        if transport is not None:
            transport.close()
    if runner is not None:
        runner.close()         # graphs before the group (NCCL waits for them)
    destroy_group()
    _exit_now(0)


def _exit_now(code: int) -> None:
    """End the rank without the interpreter's teardown: everything it holds is released
    above, and tearing down torch's modules costs about a second of CPU, which on a
    loaded host outlasts TPWorkerGroup.shutdown's polite wait (the rank was then killed)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class TPWorkerGroup:
    def __init__(self, spec: WorkerSpec):
        if spec.size < 2:
            raise ValueError("a worker group needs tensor_parallel_size >= 2")
        if spec.transport not in ("shm", "torch") or spec.device_type not in ("cpu", "cuda"):
            raise ValueError(f"transport must be shm|torch and device_type cpu|cuda, got "
                             f"{spec.transport!r}, {spec.device_type!r}")
        self.spec = spec
        self.procs: list = []
        self.conns: list = []
        self.error: TPWorkerError | None = None
        self.transport = None
        self._stopping = threading.Event()
        self._cpu_threads = torch.get_num_threads()   # rank 0's, restored at shutdown
        self._watchdog: threading.Thread | None = None

    # -- start -------------------------------------------------------------------------
    def start(self) -> TPInfo:
        """Spawn ranks 1..N-1 and join the process group as rank 0; returns rank 0's TPInfo."""
        try:
            return self._start()
        except BaseException:
            self.shutdown()
            raise

    def _start(self) -> TPInfo:
        from engine.worker.models.loader import check_tensor_parallel, model_config
        check_tensor_parallel(model_config(self.spec.model), self.spec.size)  # before spawning
        check_devices(self.spec.device_type, self.spec.size)
        spec, port = self.spec, free_port()
        ctx = mp.get_context("spawn")
        # a worker waiting for the next step sleeps on its semaphore (docs/TP.md: wake-up)
        wakeups = [ctx.Semaphore(0) for _ in range(spec.size - 1)]
        shm = ShmBroadcast(None, spec.size - 1, 0, alive=self.alive, wakeups=wakeups) \
            if spec.transport == "shm" else None
        self.transport = shm
        with _spawning():
            for rank in range(1, spec.size):
                parent_end, child_end = ctx.Pipe()
                proc = ctx.Process(target=worker_main, name=f"roseplay-tp{rank}", daemon=True,
                                   args=(rank, spec, port, shm and (shm.name, wakeups),
                                         child_end))
                proc.start()
                child_end.close()
                self.procs.append(proc)
                self.conns.append(parent_end)
        self._watchdog = threading.Thread(target=self._watch, name="tp-watchdog", daemon=True)
        self._watchdog.start()
        self._await("joining")   # a worker dead before the rendezvous must not hang rank 0
        bind_device(spec.device_type, 0, spec.size)
        group = init_group(TPInfo(0, spec.size), port, spec.device_type, spec.timeout_s)
        self.transport = shm or TorchBroadcast(group, 0)
        return TPInfo(0, spec.size)

    def wait_ready(self) -> None:
        """Block until every worker has loaded its shard (or raise what one reported)."""
        self._await("ready")

    def _await(self, expected: str) -> None:
        """Every worker's next message is `expected`; a death, an error report or the
        start-up timeout stops the group and raises a TPWorkerError naming the rank."""
        try:
            deadline = time.monotonic() + self.spec.timeout_s
            pending = dict(zip(self.conns, range(1, self.spec.size)))
            while pending:
                self.check()
                for conn in wait(list(pending), timeout=0.1):
                    rank = pending.pop(conn)
                    kind, detail = self._recv(conn, rank)
                    if kind != expected:
                        self._set_error(f"tensor-parallel rank {rank} failed to start: {detail}")
                if time.monotonic() > deadline:
                    self._set_error(f"tensor-parallel ranks {sorted(pending.values())} not "
                                    f"{expected} after {self.spec.timeout_s:.0f} s")
            self.check()
        except BaseException:
            self.shutdown()
            raise

    def _recv(self, conn, rank: int):
        try:
            return conn.recv()
        except (EOFError, OSError):
            return "error", f"rank {rank} exited"

    # -- per step ------------------------------------------------------------------------
    def allocate_kv(self, num_blocks: int, block_size: int, **runner_kwargs) -> None:
        """Every worker builds its runner: `ModelRunner(model, ops, device, dtype,
        num_blocks=, block_size=, **runner_kwargs)` (its KV pool: the same block ids); rank
        0 builds its own with the same arguments right after (graph capture in step)."""
        self._send(("kv", dict(num_blocks=num_blocks, block_size=block_size, **runner_kwargs)))

    def broadcast(self, batch, released=()) -> None:
        """Send a step to every worker (rank 0 then runs the same step), with the request
        ids whose sampler state ends before it."""
        self._send(("step", (batch, tuple(released))))

    def send_rewind(self) -> None:
        """Each worker undoes its last step's draws (Sampler.rewind): rank 0's launch of
        it failed, and its requests run again."""
        self._send(("rewind", None))

    def send_transfer(self, xfer) -> None:
        """Send a step's copies between the KV tiers (engine/worker/kv_transfer.py): each
        worker runs them on its own shard before the step that follows."""
        self._send(("xfer", xfer))

    def run(self, batch, forward, released=()):
        """One step on every rank: broadcast `batch`, run rank 0's `forward(batch)`, return
        its result. A collective that fails because a rank died raises TPWorkerError naming
        it."""
        self.broadcast(batch, released)
        try:
            return forward(batch)
        except RuntimeError as exc:
            self.check(wait_s=2.0)
            raise TPWorkerError(f"tensor-parallel step failed on rank 0: {exc}") from exc

    def _send(self, message) -> None:
        self.check()
        try:
            self.transport.send(message)
        except (TransportError, RuntimeError) as exc:
            self.check(wait_s=1.0)     # a dead rank explains the transport error
            raise TPWorkerError(f"tensor-parallel step broadcast failed: {exc}") from exc

    def alive(self) -> bool:
        return self.error is None

    def check(self, wait_s: float = 0.0) -> None:
        """Raise the group's error if a rank has failed. After a collective raised (a
        peer's socket closed), wait_s gives the watchdog time to name the dead rank."""
        deadline = time.monotonic() + wait_s
        while self.error is None and time.monotonic() < deadline and self._watching():
            time.sleep(0.01)
        if self.error is not None:
            raise self.error

    def _watching(self) -> bool:
        return self._watchdog is not None and self._watchdog.is_alive()

    # -- failure watchdog ------------------------------------------------------------------
    def _watch(self) -> None:
        sentinels = {p.sentinel: (rank, p) for rank, p in enumerate(self.procs, start=1)}
        while sentinels and not self._stopping.is_set():
            for s in wait(list(sentinels), timeout=0.1):
                rank, proc = sentinels.pop(s)
                if self._stopping.is_set():
                    return
                proc.join(0.1)
                detail = self._last_error(rank)
                self._set_error(f"tensor-parallel rank {rank} (pid {proc.pid}) exited with "
                                f"code {proc.exitcode}{detail}; the engine cannot continue")
                abort_group()
                return

    def _last_error(self, rank: int) -> str:
        conn = self.conns[rank - 1]
        try:
            while conn.poll(0):
                kind, detail = conn.recv()
                if kind == "error":
                    return f": {detail.splitlines()[0]}"
        except (EOFError, OSError):
            pass
        return ""

    def _set_error(self, message: str) -> None:
        if self.error is None:
            self.error = TPWorkerError(message)

    # -- stop ----------------------------------------------------------------------------------
    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop every worker (politely, then by kill) and leave the group; idempotent.
        Rank 0 leaves the group while the workers leave theirs (NCCL's teardown can be
        collective); rank 0's runner must be closed first (ModelRunner.close)."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        if self.error is None and self.transport is not None:
            try:
                self.transport.send(("stop", None))
            except Exception:
                pass
        if self.error is not None:   # a peer is gone: a collective teardown could block
            abort_group()
        destroy_group(timeout_s)
        deadline = time.monotonic() + timeout_s
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
                proc.join(5.0)
        if self._watchdog is not None:
            self._watchdog.join(1.0)
        if self.transport is not None:
            self.transport.close()
        for conn in self.conns:
            conn.close()
        torch.set_num_threads(self._cpu_threads)
