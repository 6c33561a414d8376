"""Raw TCP clients for the HTTP-timeout tests: a connection to a test server, and how
long the server takes to close it while the client stays silent or trickles bytes."""
from __future__ import annotations

import socket
import time


def connect(server, timeout: float = 60) -> socket.socket:
    sock = socket.create_connection((server.host, server.port), timeout=timeout)
    sock.settimeout(timeout)
    return sock


def closed_after(sock: socket.socket, trickle: bytes = b"", every: float = 0.1) -> float:
    """Seconds until the server closes `sock`, sending one byte of `trickle` every `every` s."""
    t0 = time.monotonic()
    sock.setblocking(False)
    for i in range(10 ** 6):
        if i < len(trickle):
            try:
                sock.send(trickle[i:i + 1])
            except OSError:
                return time.monotonic() - t0
        try:
            if sock.recv(65536) == b"":
                return time.monotonic() - t0
        except BlockingIOError:
            pass
        except OSError:
            return time.monotonic() - t0
        assert time.monotonic() - t0 < 30, "the server never closed the connection"
        time.sleep(every)
    raise AssertionError("unreachable")
