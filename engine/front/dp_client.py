"""DPClient: EngineAPI (engine/front/api.py) over N engine processes, one front that routes
each request (data parallelism, docs/ROUTING.md).

`DPClient(data_parallel_size=N, **engine_kwargs)` launches N engine processes at once
(replica r: data_parallel_rank r; on CUDA its own CUDA_VISIBLE_DEVICES slice of
tensor_parallel_size GPUs), each owned by an EngineClient, and turns on their KV events
(kv_events_config) for the router's index (engine/front/kv_index.py). `submit` tokenizes
once, asks the Router (engine/front/router.py) for a replica and submits there; the
request's events come back through that replica's client. Load is vLLM's: each replica's
latest stats (waiting, running, KV blocks in use) plus what this front sent it since
those stats were built (their time, the engine's perf_counter, read on this process's
clock: ZmqTransport.clock_offset, measured at its Welcome, since a replica may run on
another host).

`DPClient(engine_addresses=[A, B, ...])` attaches to engines that run elsewhere instead
(engine/front/dp_attach.py), one replica each; closing it detaches them.

A replica that dies fails only its own requests (its client ends them with an error);
the router skips it from then on. The front is gone (`fatal_error`) only when every
replica is.
"""
from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections import OrderedDict, deque
from typing import Callable

import msgspec

from engine.config import InvalidRequestError, SchedulerConfig, make_config
from engine.config_json import KVEventsConfig
from engine.engine_stats import EngineStats
from engine.front.api import CLOSE_TIMEOUT, CoreControls, EngineStopped
from engine.front.client import STARTUP_TIMEOUT, EngineClient
from engine.front.dp_attach import attach_replicas, front_config
from engine.front.dp_views import merge_snapshots, stats_sum
from engine.front.kv_index import KVIndexFeed
from engine.front.processor import InputProcessor, StreamEvent
from engine.front.router import ReplicaLoad, RouteDecision, Router
from engine.front.stream import RequestStream
from engine.ipc import auth
from engine.ipc.launch import EngineLaunch
from engine.request import SamplingParams
from engine.snapshot import EngineSnapshot

REPLICA_PORTS = 5     # a replica's tcp ports: its engine's 3, its KV events' 2
PLACED_KEEP = 1 << 17   # requests whose replica replica_of() still tells (a bench's run)


def replica_address(address: str | None, rank: int) -> str | None:
    """Replica `rank`'s engine address from the front's (None: private ipc sockets)."""
    if address is None or rank == 0:
        return address
    if address.startswith("tcp://"):
        host, _, port = address.rpartition(":")
        return f"{host}:{int(port) + REPLICA_PORTS * rank}"
    return f"{address}_dp{rank}"


def replica_env(config, rank: int) -> dict:
    """CUDA_VISIBLE_DEVICES for replica `rank`: its tensor_parallel_size GPUs of the
    visible ones (all of them by index when none are named)."""
    if config.device == "cpu":
        return {}
    tp = config.tensor_parallel_size
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = visible.split(",") if visible else [str(i) for i in range(
        config.data_parallel_size * tp)]
    mine = devices[rank * tp:(rank + 1) * tp]
    if len(mine) < tp:
        raise InvalidRequestError(f"data_parallel_size x tensor_parallel_size = "
                                  f"{config.data_parallel_size * tp} GPUs; "
                                  f"CUDA_VISIBLE_DEVICES lists {len(devices)}")
    return {"CUDA_VISIBLE_DEVICES": ",".join(mine)}


class DPClient(CoreControls):
    def __init__(self, *, address: str | None = None, label: str = "client",
                 on_progress: Callable[[str], None] | None = None,
                 startup_timeout: float = STARTUP_TIMEOUT, snapshots: bool = True,
                 engine_key: str | None = None, engine_addresses: list[str] | None = None,
                 **engine_kwargs):
        """Starts data_parallel_size engine processes (bound next to `address`), or with
        `engine_addresses` attaches to running ones, one replica each (engine/front/
        dp_attach.py: only the routing knobs are taken then)."""
        if engine_addresses is not None:
            if address is not None:
                raise InvalidRequestError("give engine_addresses (engines to attach to) or "
                                          "address (where started engines bind), not both")
            config = front_config(list(engine_addresses), engine_kwargs)
            self.size = config.data_parallel_size
            self.replicas: list[EngineClient] = attach_replicas(
                list(engine_addresses), engine_key, label, startup_timeout, snapshots,
                on_progress)
        else:
            config = make_config(**engine_kwargs)    # bad knobs: refused before any start
            if config.data_parallel_rank:
                raise InvalidRequestError(
                    f"data_parallel_rank {config.data_parallel_rank}: the front gives each "
                    f"replica it starts its own (0..{config.data_parallel_size - 1}); drop it")
            self.size = config.data_parallel_size
            if not config.kv_events_enabled:     # the index needs them; the rest of a
                given = config.kv_events_config or KVEventsConfig()   # given config holds
                engine_kwargs["kv_events_config"] = {**dataclasses.asdict(given),
                                                     "enable_kv_cache_events": True,
                                                     "publisher": "zmq"}
                config = make_config(**engine_kwargs)
            key = auth.given_key(engine_key) or auth.new_key()    # one for every replica
            self.replicas = self._start(engine_kwargs, config, address, key, label,
                                        on_progress, startup_timeout, snapshots)
        self.closed = False
        try:
            self._setup(config)
        except BaseException:
            self.close()
            raise

    def _start(self, kwargs, config, address, key, label, on_progress, timeout, snapshots):
        launches, clients = [], []
        try:
            for r in range(self.size):     # every process loads at once
                launches.append(EngineLaunch({**kwargs, "data_parallel_rank": r},
                                             replica_address(address, r), key,
                                             env=replica_env(config, r)))
            for r, launch in enumerate(launches):
                clients.append(EngineClient(launch=launch, label=f"{label}-dp{r}",
                                            on_progress=on_progress,
                                            startup_timeout=timeout, snapshots=snapshots))
        except BaseException:
            for c in clients:
                c.close()
            for launch in launches[len(clients) + 1:]:   # the failed one reaped itself
                launch.abort()
            raise
        return clients

    def _setup(self, config) -> None:
        first = self.replicas[0]
        # replica 0's info with the smallest pool: a request taken fits every replica
        self.info, self.tokenizer = msgspec.structs.replace(
            first.info, num_blocks=min(c.info.num_blocks for c in self.replicas)), first.tokenizer
        self.inputs = InputProcessor.of(self.tokenizer, self.info)
        events = [c.transport.kv_events for c in self.replicas]    # their Welcomes'
        self.kv_index = KVIndexFeed([(e.endpoint, e.replay_endpoint) for e in events],
                                    [c.transport.engine_key for c in self.replicas],
                                    [e.topic for e in events])
        self.router = Router(self.size, self.info.block_size, config.routing_policy,
                             config.kv_overlap_score_weight, self.kv_index.caches)
        self._lock = threading.Lock()
        self._owner: dict[str, int] = {}              # live request id -> replica
        self._placed: OrderedDict[str, int] = OrderedDict()   # the latest PLACED_KEEP
        self._sent = [deque() for _ in self.replicas]    # (time, blocks) since stats
        self._sent_blocks = [0] * self.size

    # -- the client API (any thread) -----------------------------------------------------
    @property
    def knobs(self) -> SchedulerConfig:
        return self.replicas[0].knobs

    @property
    def paused(self) -> bool:
        return any(c.paused for c in self.replicas)

    @property
    def fatal_error(self) -> str | None:
        """Set once every replica is gone."""
        errors = [c.fatal_error for c in self.replicas]
        if all(errors):
            return f"every engine replica stopped ({errors[0]})"
        return None

    @property
    def unavailable(self) -> str | None:
        reasons = [c.unavailable for c in self.replicas]
        return None if not all(reasons) else reasons[0]

    def alive(self, rank: int) -> bool:
        return self.replicas[rank].fatal_error is None and not self.closed

    def set_routing_policy(self, policy: str) -> str:
        """Switch the routing policy live (InvalidRequestError for an unknown one)."""
        self.router.policy = policy
        return policy

    def submit(self, prompt, params: SamplingParams | None = None, request_id: str | None = None,
               on_finish: Callable[[StreamEvent], None] | None = None,
               on_event: Callable[[StreamEvent], None] | None = None,
               priority: int = 0, data_parallel_rank: int | None = None) -> RequestStream:
        """EngineAPI.submit, routed; `data_parallel_rank` pins a replica (while it lives)."""
        if self.closed or self.fatal_error:
            raise EngineStopped(f"engine is stopped ({self.fatal_error or 'closed'})")
        pinned = self._check_rank(data_parallel_rank)
        creq, text = self.inputs.process(prompt, params, request_id, priority)
        rid, ids = creq.request_id, list(creq.prompt_token_ids)
        prompt = {"prompt_token_ids": ids, "prompt": text}
        for _ in range(self.size):      # a replica that died since its last check: the next
            with self._lock:
                if rid in self._owner:
                    raise InvalidRequestError(f"duplicate request id {rid!r}")
                decision = self.router.choose(rid, ids, self._loads(), pinned)
                self._note_sent(decision.chosen, len(ids))
                self._owner[rid] = self._placed[rid] = decision.chosen
                if len(self._placed) > PLACED_KEEP:
                    self._placed.popitem(last=False)
            try:
                return self._submit_to(decision, prompt, creq, on_finish, on_event)
            except EngineStopped:
                self._forget(rid)
            except BaseException:
                self._forget(rid)
                raise
        raise EngineStopped("every engine replica is gone")

    def _submit_to(self, decision: RouteDecision, prompt: dict, creq, on_finish, on_event):
        rid, replica = creq.request_id, self.replicas[decision.chosen]
        args = (prompt, creq.params, rid)
        if on_event is None and on_finish is None:      # the caller reads a stream
            stream = RequestStream(rid, self.cancel, self._cancel_dropped)
            replica.submit(*args, on_event=self._tracked(rid, stream.sink),
                           priority=creq.priority).detach()
            return stream
        if on_event is not None:
            return replica.submit(*args, on_event=self._tracked(rid, on_event),
                                  on_finish=on_finish, priority=creq.priority)
        return replica.submit(*args, on_finish=self._tracked(rid, on_finish),
                              priority=creq.priority)

    def _check_rank(self, rank) -> int | None:
        if rank is None:
            return None
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.size:
            raise InvalidRequestError(f"data_parallel_rank must be an integer in "
                                      f"[0, {self.size - 1}], got {str(rank)[:40]!r}")
        return rank

    def _tracked(self, rid: str, sink: Callable[[StreamEvent], None]):
        def tracked(event: StreamEvent) -> None:
            if event.finished:
                self._forget(rid)
            sink(event)
        return tracked

    def _forget(self, rid: str) -> None:
        with self._lock:
            self._owner.pop(rid, None)

    def _note_sent(self, rank: int, prompt_len: int) -> None:
        blocks = -(-prompt_len // self.info.block_size)
        self._sent[rank].append((time.perf_counter(), blocks))
        self._sent_blocks[rank] += blocks

    def _loads(self) -> list[ReplicaLoad]:
        """Each replica's stats, plus what was sent to it after they were built (the
        stats' time on this process's clock: the engine may run on another host)."""
        loads = []
        for r, c in enumerate(self.replicas):
            if not self.alive(r):          # nothing runs there now, whatever it was sent
                loads.append(ReplicaLoad(0, 0, 0, False))
                continue
            st, sent = c.engine_stats(), self._sent[r]
            built = st.time + c.transport.clock_offset
            while sent and sent[0][0] <= built:
                self._sent_blocks[r] -= sent.popleft()[1]
            loads.append(ReplicaLoad(st.num_waiting + len(sent), st.num_running,
                                     st.num_used_blocks + self._sent_blocks[r], self.alive(r)))
        return loads

    def loads(self) -> list[ReplicaLoad]:
        with self._lock:
            return self._loads()

    def replica_of(self, request_id: str) -> int | None:
        """The replica that served (or serves) a request: one of the latest PLACED_KEEP."""
        return self._placed.get(request_id)

    def cancel(self, request_id: str) -> None:
        rank = self._owner.get(request_id) if isinstance(request_id, str) else None
        if rank is not None:
            self.replicas[rank].cancel(request_id)

    def _cancel_dropped(self, request_id: str) -> None:
        rank = self._owner.get(request_id)
        if rank is not None:
            self.replicas[rank]._cancel_dropped(request_id)

    def set_knobs(self, **changes) -> SchedulerConfig:
        knobs = self.knobs.replace(**changes)          # validated once, before any is sent
        for c in self._live():
            c.set_knobs(**changes)
        return knobs

    def send_command(self, cmd) -> None:
        """CoreControls: the command to every live replica."""
        for c in self._live():
            c.send_command(cmd)

    def pause(self) -> None:
        for c in self._live():
            c.pause()

    def resume(self) -> None:
        for c in self._live():
            c.resume()

    def step_once(self) -> threading.Event:
        """One step of every live replica; the event fires after the last."""
        events, done = [c.step_once() for c in self._live()], threading.Event()

        def wait_all():
            for e in events:
                e.wait()
            done.set()
        threading.Thread(target=wait_all, name="roseplay-dp-step", daemon=True).start()
        return done

    def watch(self, on: bool) -> None:
        for c in self.replicas:
            c.watch(on)

    def snapshot(self) -> EngineSnapshot:
        """The replicas' snapshots merged (engine/front/dp_views.py)."""
        return merge_snapshots([c.snapshot() for c in self.replicas])

    def replica_snapshots(self) -> list[EngineSnapshot]:
        return [c.snapshot() for c in self.replicas]

    def engine_stats(self) -> EngineStats:
        """The live replicas' stats summed (replica_stats(): each)."""
        live = [c.engine_stats() for r, c in enumerate(self.replicas) if self.alive(r)]
        return stats_sum(live or [c.engine_stats() for c in self.replicas])

    def replica_stats(self) -> list[EngineStats]:
        return [self._stats(r) for r in range(len(self.replicas))]

    def _stats(self, rank: int) -> EngineStats:
        """A replica's latest stats; a dead one's keep its counters (a Prometheus counter
        never goes back) but hold nothing now: its last stats were its load as it died,
        which /metrics and /routing showed as running for good."""
        st = self.replicas[rank].engine_stats()
        if self.alive(rank):
            return st
        return msgspec.structs.replace(st, num_running=0, num_waiting=0, num_used_blocks=0,
                                       spec_draft_num_used_blocks=0, host_num_used_blocks=0)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Every live replica idle, and the router's index holding every KV event they
        published until then (so a routing decision sees their caches)."""
        deadline = None if timeout is None else time.perf_counter() + timeout
        left = lambda: None if deadline is None else max(0.0, deadline - time.perf_counter())  # noqa: E731
        ok = True
        for r, c in enumerate(self.replicas):
            if self.alive(r):
                ok = c.wait_idle(left()) and ok
                ok = self.kv_index.wait_for(r, c.engine_stats().kv_events_seq,
                                            left() if deadline else 60.0) and ok
        return ok and self.fatal_error is None

    def draining(self, seconds: float) -> None:
        for c in self.replicas:
            c.draining(seconds)

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Stop every replica (each EngineClient: the process it started; one attached by
        address detaches, its engine keeps serving) and the index; idempotent."""
        if self.closed:
            return
        self.closed = True
        for c in self.replicas:
            c.close(timeout)
        feed = getattr(self, "kv_index", None)
        if feed is not None:
            feed.close()

    def __enter__(self) -> "DPClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _live(self) -> list[EngineClient]:
        return [c for r, c in enumerate(self.replicas) if self.alive(r)]


def engine_front(*, label: str, snapshots: bool = True, address: str | None = None,
                 engine_key: str | None = None, engine_addresses: list[str] | None = None,
                 on_progress: Callable[[str], None] | None = None, **engine_kwargs):
    """The front a command starts: an EngineClient owning one engine process, a
    DPClient over data_parallel_size of them, or a DPClient attached to the running
    engines at engine_addresses. on_progress hears the start's progress and, attaching,
    that an address does not answer yet."""
    if engine_addresses is not None or engine_kwargs.get("data_parallel_size", 1) > 1:
        return DPClient(address=address, label=label, snapshots=snapshots,
                        engine_key=engine_key, engine_addresses=engine_addresses,
                        on_progress=on_progress, **engine_kwargs)
    return EngineClient(address=address, label=label, snapshots=snapshots,
                        engine_key=engine_key, on_progress=on_progress, **engine_kwargs)
