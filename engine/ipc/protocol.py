"""The typed messages between engine clients and the engine-core process (msgspec).

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

Only a client whose Hello carries the engine key is served (engine/ipc/auth.py).
"""
from __future__ import annotations

import msgspec
import numpy as np

from engine.outputs import TokenLogprobs
from engine.snapshot import EngineSnapshot
from engine.stats import EngineStats

MAX_MESSAGE_BYTES = 64 * 1024 * 1024     # zmq MAXMSGSIZE on the core's input socket


class Hello(msgspec.Struct, tag=True):
    client: str                  # a label shown with the client's requests (e.g. "tui")
    key: str = ""                # the engine key (engine/ipc/auth.py): no key, no service


class Submit(msgspec.Struct, tag=True):
    request_id: str
    prompt_token_ids: list[int]
    params: dict                 # SamplingParams fields; the core rebuilds (validates) it
    arrival_time: float
    prompt_preview: str | None = None
    priority: int = 0            # checked by the core (engine.config.check_priority)


class Abort(msgspec.Struct, tag=True):
    request_id: str
    reason: str = "cancelled"
    error: str | None = None


class SetKnobs(msgspec.Struct, tag=True):
    knobs: dict                  # the changed SchedulerConfig fields; the core validates them


class SetPaused(msgspec.Struct, tag=True):
    paused: bool


class StepOnce(msgspec.Struct, tag=True):
    token: int


class ClearPrefixCache(msgspec.Struct, tag=True):
    pass


class ResetPeakUsage(msgspec.Struct, tag=True):
    pass


class Barrier(msgspec.Struct, tag=True):
    """Reply when the core is idle with a snapshot taken after its last step."""
    token: int


class Heartbeat(msgspec.Struct, tag=True):
    pass


class Bye(msgspec.Struct, tag=True):
    """The client leaves: its requests are cancelled."""


class Shutdown(msgspec.Struct, tag=True):
    """Stop the engine (the owner's close): honoured only with the owner's token, given
    to the core at start (--owner-token), so an attached client cannot stop it."""
    token: str = ""


ClientMessage = (Hello | Submit | Abort | SetKnobs | SetPaused | StepOnce | ClearPrefixCache
                 | ResetPeakUsage | Barrier | Heartbeat | Bye | Shutdown)


class Welcome(msgspec.Struct, tag=True):
    info: dict                   # EngineInfo fields
    knobs: dict
    paused: bool


class Finished(msgspec.Struct, array_like=True):
    request_id: str
    finish_reason: str
    error: str | None
    arrival_time: float
    num_cached_tokens: int
    num_preemptions: int


class Outputs(msgspec.Struct, tag=True):
    """One step's results for one client: parallel lists, one entry per new token."""
    time: float
    request_ids: list[str]
    token_ids: list[int]
    finished: list[Finished]
    logprobs: list[TokenLogprobs | None] | None = None   # parallel to token_ids, if any


class StepDone(msgspec.Struct, tag=True):
    token: int


class BarrierDone(msgspec.Struct, tag=True):
    token: int
    snapshot: bytes


class Fatal(msgspec.Struct, tag=True):
    message: str


class Refused(msgspec.Struct, tag=True):
    """The answer to a Hello without the right key (and the only one such a client gets)."""
    message: str


class Stats(msgspec.Struct, tag=True):
    """The engine's gauges and counters, to every client (engine/stats.py EngineStats)."""
    stats: EngineStats


CoreMessage = Welcome | Outputs | StepDone | BarrierDone | Fatal | Refused | Stats


def _enc_hook(obj):
    if isinstance(obj, np.ndarray):
        return (obj.dtype.str, obj.tobytes())
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def _dec_hook(tp, obj):
    if tp is np.ndarray:
        dtype, raw = obj
        return np.frombuffer(raw, dtype=np.dtype(dtype)).copy()
    raise NotImplementedError(f"cannot decode {tp}")


encoder = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
client_decoder = msgspec.msgpack.Decoder(ClientMessage)
core_decoder = msgspec.msgpack.Decoder(CoreMessage)
snapshot_decoder = msgspec.msgpack.Decoder(EngineSnapshot, dec_hook=_dec_hook)


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
