"""CURVE on the engine's sockets: nothing of a peer without the engine key reaches Python.

The engine's CURVE key pair is derived from the engine key (engine/ipc/auth.py); a
client derives the engine's public key from the same key. That public key is never sent
(CurveZMQ's HELLO is a box sealed to it), so a peer without the engine key cannot build a
HELLO the engine can open: libzmq closes that connection in its own I/O thread, after
one Curve25519 operation, before any frame reaches the engine's code. So an
unauthenticated peer costs a constant per connection (at most one frame of `MAXMSGSIZE`
bytes, read before the handshake rejects it) and nothing per message. Each connection
has its own short-term keys: the traffic is encrypted, and a recorded session (a Hello
seen with strace, say) cannot be replayed. Clients make a fresh key pair of their own:
what the engine authenticates is knowledge of the engine key, and every key holder is
equally trusted (docs/SERVE.md "Security").
"""
from __future__ import annotations

import hashlib
import hmac

import zmq
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from engine.config import InvalidRequestError

HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                    | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


def engine_keypair(key: str) -> tuple[bytes, bytes]:
    """(public, secret), Z85: the engine's CURVE keys, a function of the engine key."""
    secret = z85.encode(hmac.new(key.encode(), b"roseplay-curve-engine", hashlib.sha256).digest())
    return zmq.curve_public(secret), secret


def check_available() -> None:
    if not zmq.has("curve"):
        raise InvalidRequestError("this pyzmq's libzmq was built without CURVE, which the "
                                  "engine's sockets need: install pyzmq from a wheel "
                                  "(it bundles libzmq with libsodium)")


def serve(sock: zmq.Socket, key: str, max_message_bytes: int) -> None:
    """Make `sock` (before bind) a CURVE server for the engine key; a frame over
    `max_message_bytes` closes its connection, before the handshake as after it."""
    public, secret = engine_keypair(key)
    sock.curve_server = True
    sock.curve_publickey, sock.curve_secretkey = public, secret
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)


def attach(sock: zmq.Socket, key: str) -> None:
    """Make `sock` (before connect) a CURVE client of the engine whose key is `key`."""
    sock.curve_serverkey = engine_keypair(key)[0]
    sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()


class HandshakeWatch:
    """Tells whether a socket's CURVE handshake failed: the engine could not open our
    HELLO, so the key we hold is not the engine's. Made before the socket connects (a
    first failure is not always retried)."""

    def __init__(self, sock: zmq.Socket):
        self._sock = sock
        self._monitor = sock.get_monitor_socket(HANDSHAKE_FAILED)

    def failed(self) -> bool:
        while self._monitor.poll(0):
            if recv_monitor_message(self._monitor)["event"] & HANDSHAKE_FAILED:
                return True
        return False

    def close(self) -> None:
        self._sock.disable_monitor()
        self._monitor.close(0)
