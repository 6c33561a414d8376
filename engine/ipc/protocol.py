"""The wire between engine clients and the engine-core process (msgspec).

What the core takes and gives is sent as it is: a CoreRequest, the commands of
engine/commands.py, and each client's part of a StepOutput (engine/outputs.py). Only
what the process seam itself needs is declared here: attaching (Hello, Welcome,
Detached), liveness (Heartbeat, Bye), the owner's Draining and Shutdown, the answers to StepOnce and
Barrier, stats, Fatal, and the snapshot frame.

Why msgspec + pyzmq (as vLLM V1): msgpack is compact and msgspec decodes straight into
typed structs, checking every field's type on the way in, so a client can never hand
the core a value of the wrong type; pyzmq gives queues with high-water marks (a slow
snapshot subscriber drops frames instead of slowing the engine) and identities for
routing each client's outputs back to it. Nothing is pickled: a peer that is not ours
can at worst send a message that fails validation.

Sockets (ADDRESS = tcp://127.0.0.1:PORT or ipc:///path/name):
  in   ROUTER at PORT   / name.in    clients (DEALER) -> core: commands
  out  ROUTER at PORT+1 / name.out   core -> clients (DEALER): outputs, replies
  pub  XPUB   at PORT+2 / name.pub   core -> clients (SUB, conflated): snapshots
  and with kv_events_config on, unless it names its own endpoints (kv_event_endpoints):
  kv   PUB    at PORT+3 / name.kv-events   KV events (engine/kv_events.py)
  kvr  ROUTER at PORT+4 / name.kv-replay   their replay

Every socket is a CURVE server keyed by the engine key (engine/ipc/curve.py): a peer
without the key never gets past the handshake, so every message here comes from a key
holder. A key holder is served once it said Hello (until it leaves or is judged gone:
engine/ipc/liveness.py); to anything else it sends, the engine answers Detached.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Annotated

import msgspec
import numpy as np

from engine.commands import COMMANDS
from engine.config import SchedulerConfig
from engine.outputs import CoreRequest, EngineInfo, StepOutput
from engine.snapshot import EngineSnapshot
from engine.engine_stats import EngineStats

CONTROL_MESSAGE_BYTES = 64 * 1024   # MAXMSGSIZE of the sockets clients only subscribe on
MAX_LABEL_CHARS = 64
MAX_DRAIN_S = 3600.0     # the longest drain an owner may announce


def max_message_bytes(max_model_len: int) -> int:
    """The engine's MAXMSGSIZE for client commands: a CoreRequest at every bound (9 bytes a
    prompt token at most, 1 MiB for the rest: stop strings, logit_bias, ids, framing).
    A frame over it closes its connection, so a client checks its requests against it."""
    return 9 * max_model_len + (1 << 20)


class Hello(msgspec.Struct, tag=True):
    """Attach (again): the engine admits the sender and answers Welcome."""
    client: Annotated[str, msgspec.Meta(max_length=MAX_LABEL_CHARS)]   # shown with its requests


class SubmitHead(msgspec.Struct, tag="CoreRequest"):
    """The request id of a CoreRequest that failed to decode, to refuse it by its id."""
    request_id: str


class Heartbeat(msgspec.Struct, tag=True):
    """I am alive: a client's every 0.5 s, the engine's to every client every second."""


class Bye(msgspec.Struct, tag=True):
    """The client leaves: its requests are cancelled."""


class Shutdown(msgspec.Struct, tag=True):
    """Stop the engine (the owner's close): honoured only with the owner's token, given
    to the core at start (--owner-token), so an attached client cannot stop it."""
    token: str = ""


class Draining(msgspec.Struct, tag=True):
    """The owner drains its open requests for up to `seconds` before its Shutdown: a
    SIGTERM that reached the engine with it (a whole process group or cgroup stopped,
    as systemd and `timeout` do) then waits for that Shutdown, so the drain is served.
    Honoured only with the owner's token."""
    seconds: Annotated[float, msgspec.Meta(ge=0, le=MAX_DRAIN_S)]
    token: str = ""


ClientMessage = typing.Union[(Hello, CoreRequest, *COMMANDS, Heartbeat, Bye, Shutdown,
                              Draining)]


class KVEventsEndpoints(msgspec.Struct, frozen=True):
    """Where an engine publishes its KV events, as it bound them (kv_events_config on):
    a front attached by address subscribes there (engine/front/kv_index.py)."""
    endpoint: str
    replay_endpoint: str | None
    topic: str


class Welcome(msgspec.Struct, tag=True):
    info: EngineInfo
    knobs: SchedulerConfig
    paused: bool
    client_timeout: float        # the stall policy both ends keep (engine/ipc/liveness.py)
    kv_events: KVEventsEndpoints | None = None     # None: the engine publishes none
    time: float = 0.0     # the engine's perf_counter as it answers: its clock against ours


class StepDone(msgspec.Struct, tag=True):
    token: int


class BarrierDone(msgspec.Struct, tag=True):
    token: int
    snapshot: bytes


class Fatal(msgspec.Struct, tag=True):
    message: str


class Detached(msgspec.Struct, tag=True):
    """The engine does not count the receiver as attached: it dropped it (silent for
    client_timeout; its requests ended with an error) or never heard its Hello. What
    the receiver sent since was not applied; it says Hello to attach again."""
    message: str


class Stats(msgspec.Struct, tag=True):
    """The engine's gauges and counters, to every client (engine/core/stats.py EngineStats)."""
    stats: EngineStats


CoreMessage = Welcome | StepOutput | StepDone | BarrierDone | Fatal | Detached | Stats | Heartbeat


class BlockArray(msgspec.Struct, array_like=True):
    """A numpy array on the wire: its dtype (numpy's str) and raw bytes."""
    dtype: str
    data: bytes


def _frame_struct() -> type[msgspec.Struct]:
    """SnapshotFrame: EngineSnapshot's fields, typed, with its numpy arrays as
    BlockArray; built from the view's own fields so a field is declared once."""
    hints = typing.get_type_hints(EngineSnapshot)
    fields = [(f.name, BlockArray if hints[f.name] is np.ndarray else hints[f.name])
              for f in dataclasses.fields(EngineSnapshot)]
    return msgspec.defstruct("SnapshotFrame", fields, array_like=True, module=__name__)


SnapshotFrame = _frame_struct()
_ARRAYS = tuple(name for name, tp in zip(SnapshotFrame.__struct_fields__,
                                         typing.get_type_hints(SnapshotFrame).values())
                if tp is BlockArray)


def snapshot_frame(snap: EngineSnapshot) -> SnapshotFrame:
    """The engine process's snapshot as it goes on the wire (shallow: no copies but
    the block arrays' bytes)."""
    values = {f: getattr(snap, f) for f in SnapshotFrame.__struct_fields__}
    for name in _ARRAYS:
        arr = values[name]
        values[name] = BlockArray(arr.dtype.str, arr.tobytes())
    return SnapshotFrame(**values)


def decode_snapshot(data) -> EngineSnapshot:
    """A SnapshotFrame's bytes -> the client's EngineSnapshot view (types checked)."""
    frame = snapshot_decoder.decode(data)
    values = {f: getattr(frame, f) for f in SnapshotFrame.__struct_fields__}
    for name in _ARRAYS:
        arr = values[name]
        values[name] = np.frombuffer(arr.data, dtype=np.dtype(arr.dtype)).copy()
    return EngineSnapshot(**values)


encoder = msgspec.msgpack.Encoder()
client_decoder = msgspec.msgpack.Decoder(ClientMessage)
submit_head_decoder = msgspec.msgpack.Decoder(SubmitHead)
core_decoder = msgspec.msgpack.Decoder(CoreMessage)
snapshot_decoder = msgspec.msgpack.Decoder(SnapshotFrame)


def wire_error(exc: msgspec.ValidationError) -> str:
    """msgspec's "Expected `int`, got `str` - at `$.params.top_k`" as "top_k: Expected
    `int`, got `str`" (a bound failed in __post_init__ already names its field)."""
    text, _, path = str(exc).partition(" - at `$")
    field = path.rstrip("`").lstrip(".").removeprefix("params").lstrip(".")
    return f"{field}: {text}" if field else text


def endpoints(address: str) -> tuple[str, str, str]:
    """ADDRESS -> (in, out, pub) endpoints."""
    if address.startswith("tcp://"):
        host, _, port = address[len("tcp://"):].rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"engine address {address!r}: expected tcp://HOST:PORT")
        p = int(port)
        return tuple(f"tcp://{host}:{p + i}" for i in range(3))
    if address.startswith("ipc://"):
        return f"{address}.in", f"{address}.out", f"{address}.pub"
    raise ValueError(f"engine address {address!r}: expected tcp://HOST:PORT or ipc:///PATH")


def offset_endpoint(endpoint: str, rank: int) -> str:
    """Replica `rank`'s copy of a given endpoint (vLLM's rule): tcp PORT+rank, ipc
    PATH_dp<rank>; rank 0 keeps it, and so does a wildcard port (tcp://H:*: each
    replica binds one the system picks, and its Welcome says which)."""
    if rank == 0:
        return endpoint
    if endpoint.startswith("ipc://"):
        return f"{endpoint}_dp{rank}"
    host, _, port = endpoint.rpartition(":")
    return endpoint if port == "*" else f"{host}:{int(port) + rank}"


def kv_event_endpoints(address: str, config, rank: int = 0) -> tuple[str, str | None]:
    """(events, replay or None) of an engine at `address` whose KVEventsConfig is
    `config` (None endpoints: next to the address, as the module says)."""
    if config.endpoint is not None:
        replay = config.replay_endpoint
        return (offset_endpoint(config.endpoint, rank),
                None if replay is None else offset_endpoint(replay, rank))
    if address.startswith("tcp://"):
        host, _, port = address.rpartition(":")
        return f"{host}:{int(port) + 3}", f"{host}:{int(port) + 4}"
    return f"{address}.kv-events", f"{address}.kv-replay"


WILDCARD_HOSTS = ("*", "0.0.0.0", "::", "[::]")


def seen_from(endpoint: str, address: str) -> str:
    """An endpoint an engine bound, as a client that reached the engine at `address`
    connects to it: a wildcard host (tcp://*:P, 0.0.0.0, [::]) becomes the address's
    host (loopback when the address is itself a wildcard or an ipc path)."""
    if not endpoint.startswith("tcp://"):
        return endpoint
    host, _, port = endpoint[len("tcp://"):].rpartition(":")
    if host not in WILDCARD_HOSTS:
        return endpoint
    there = address[len("tcp://"):].rpartition(":")[0] if address.startswith("tcp://") else ""
    return f"tcp://{there if there and there not in WILDCARD_HOSTS else '127.0.0.1'}:{port}"


def kv_events_seen_from(ev: KVEventsEndpoints | None, address: str) -> KVEventsEndpoints | None:
    """The engine's KV events endpoints (its Welcome's) as a client at `address` connects."""
    if ev is None:
        return None
    replay = None if ev.replay_endpoint is None else seen_from(ev.replay_endpoint, address)
    return KVEventsEndpoints(seen_from(ev.endpoint, address), replay, ev.topic)
