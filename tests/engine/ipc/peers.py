"""Raw peers of an engine address for the attack tests (tests/engine/ipc/
test_unauthenticated_peers.py, test_engine_auth.py): a ZMTP peer
that announces one big frame, a TCP proxy that records what a client sent, and what an
engine process costs (/proc: resident memory, its peak, CPU time)."""
from __future__ import annotations

import os
import socket
import struct
import threading

from devtools.procs import status_fields

# ZMTP 3.0 greeting of a client that asks for the CURVE mechanism (rfc.zeromq.org/spec/23)
CURVE_GREETING = (b"\xff" + b"\0" * 8 + b"\x7f" + bytes([3, 0]) + b"CURVE".ljust(20, b"\0")
                  + b"\0" + b"\0" * 31)


def tcp_port(endpoint: str) -> int:
    return int(endpoint.rpartition(":")[2])


def _status_kb(pid: int, field: str) -> int:
    return int(status_fields(pid)[field])


def reset_peak_rss(pid: int) -> int:
    """Reset the process's peak resident size (VmHWM); returns its resident size, bytes."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")
    return _status_kb(pid, "VmRSS") * 1024


def peak_rss(pid: int) -> int:
    return _status_kb(pid, "VmHWM") * 1024


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def send_big_frame(port: int, size: int, chunk: int = 1 << 20) -> int:
    """A peer that speaks ZMTP with the CURVE mechanism but has no key, and sends one
    frame of `size` bytes as its first handshake command: the bytes the engine took
    before it closed the connection."""
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(CURVE_GREETING)
        block = bytes(chunk)
        try:
            s.sendall(bytes([0x06]) + struct.pack(">Q", size))   # command, long size
            while sent < size:
                sent += s.send(block[:min(chunk, size - sent)])
        except OSError:          # the engine closed the connection: what it took is `sent`
            pass
    return sent


class Recorder:
    """A TCP proxy to `port` for one connection, recording what the client sent (what
    strace of the client's process would show)."""

    def __init__(self, port: int):
        self.port, self.sent = port, bytearray()
        self._listen = socket.create_server(("127.0.0.1", 0))
        self.address = f"tcp://127.0.0.1:{self._listen.getsockname()[1]}"
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        client, _ = self._listen.accept()
        upstream = socket.create_connection(("127.0.0.1", self.port))
        back = threading.Thread(target=self._pipe, args=(upstream, client, None), daemon=True)
        back.start()
        self._pipe(client, upstream, self.sent)
        back.join(5)
        client.close()
        upstream.close()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, record: bytearray | None) -> None:
        try:
            while data := src.recv(65536):
                if record is not None:
                    record += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._listen.close()
        self._thread.join(5)
