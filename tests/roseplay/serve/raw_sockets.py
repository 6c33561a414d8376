"""Raw TCP clients for the HTTP-timeout and slow-reader tests: a connection to a test
server, how long the server takes to close it while the client stays silent or trickles
bytes, and a streamed POST whose answer the client leaves unread or reads slowly."""
from __future__ import annotations

import json
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


def post_unread(port: int, path: str, body: dict, rcvbuf: int = 2048) -> socket.socket:
    """A POST of `body` on a connection with a `rcvbuf`-byte receive buffer that the test
    then leaves unread: the server's writes to it soon wait (a client slower than its
    tokens)."""
    raw = json.dumps(body).encode()
    sock = socket.socket()
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.connect(("127.0.0.1", port))
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw)
    except BaseException:
        sock.close()
        raise
    return sock


def read_until(sock: socket.socket, marker: bytes, chunk: int = 1 << 16,
               pause: float = 0.0) -> bytes:
    """What `sock` receives until `marker` (or the server closes it), `chunk` bytes at a
    time with `pause` seconds between reads (a slow reader)."""
    data = b""
    while marker not in data:
        got = sock.recv(chunk)
        if not got:
            break
        data += got
        time.sleep(pause)
    return data
