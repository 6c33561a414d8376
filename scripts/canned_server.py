"""A server that streams canned OpenAI completion chunks as fast as it can: the load
client's ceiling (`roseplay bench --base-url`, scripts/client_ceiling.py) measured
without an engine, so the client's own limit is known before it measures one.

Raw asyncio HTTP/1.1 (keep-alive, chunked replies), chunks pre-encoded once: per event
it only writes bytes. POST /v1/completions streams `max_tokens` tokens, one chunk per
`--tokens-per-chunk` tokens, then the usage chunk and [DONE]; GET /v1/models names
dummy:tiny. `--workers N` forks N processes accepting on one socket. Prints
`listening PORT` once it accepts. Test and bench helper only, not a server to use.

    python scripts/canned_server.py --port 0 --workers 2
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys

import msgspec

MODEL = "dummy:tiny"
HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\ncache-control: no-cache\r\n\r\n")
DRAIN_EVERY = 16


class _Body(msgspec.Struct):
    max_tokens: int = 16
    prompt: msgspec.Raw = msgspec.Raw(b"null")


def http_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def sse(obj) -> bytes:
    return http_chunk(b"data: " + msgspec.json.encode(obj) + b"\n\n")


def token_event(k: int, last: bool) -> bytes:
    choice = {"index": 0, "text": "x" * k, "token_ids": [7] * k,
              "finish_reason": "length" if last else None}
    return sse({"id": "cmpl-canned", "object": "text_completion", "created": 0,
                "model": MODEL, "choices": [choice]})


def usage_event(prompt_len: int, n: int) -> bytes:
    return sse({"id": "cmpl-canned", "object": "text_completion", "created": 0, "model": MODEL,
                "choices": [], "usage": {"prompt_tokens": prompt_len, "completion_tokens": n,
                                         "total_tokens": prompt_len + n}})


def reply(status: str, body: bytes) -> bytes:
    return (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


async def stream(writer: asyncio.StreamWriter, body: bytes, per_chunk: int) -> None:
    req = msgspec.json.decode(body, type=_Body)
    n = max(1, req.max_tokens)
    prompt_len = max(1, bytes(req.prompt).count(b",") + 1)
    full, events = token_event(per_chunk, False), 0
    writer.write(HEAD)
    sent = 0
    while sent < n:
        k = min(per_chunk, n - sent)
        sent += k
        writer.write(full if k == per_chunk and sent < n else token_event(k, sent == n))
        events += 1
        if events % DRAIN_EVERY == 0:
            await writer.drain()
    writer.write(usage_event(prompt_len, n) + http_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    await writer.drain()


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 per_chunk: int) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            request_line, *lines = head.decode("latin-1").split("\r\n")
            length = next((int(v) for k, _, v in (ln.partition(":") for ln in lines)
                           if k.strip().lower() == "content-length"), 0)
            body = await reader.readexactly(length) if length else b""
            if request_line.startswith("POST /v1/completions"):
                await stream(writer, body, per_chunk)
            elif request_line.startswith("GET /v1/models"):
                writer.write(reply("200 OK", msgspec.json.encode(
                    {"object": "list", "data": [{"id": MODEL, "object": "model"}]})))
            else:
                writer.write(reply("404 Not Found", b'{"error": {"message": "not found"}}'))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def serve(sock: socket.socket, per_chunk: int, parent: int | None = None) -> None:
    server = await asyncio.start_server(lambda r, w: handle(r, w, per_chunk), sock=sock,
                                        limit=1 << 20)
    async with server:
        if parent is None:
            await server.serve_forever()
        while os.getppid() == parent:      # a worker ends with its parent, even a killed one
            await asyncio.sleep(0.5)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--workers", type=int, default=1, help="processes accepting on the socket")
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    args = ap.parse_args(argv)
    sock = socket.create_server((args.host, args.port), backlog=4096)
    children, parent = [], os.getpid()
    for _ in range(args.workers - 1):
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            asyncio.run(serve(sock, args.tokens_per_chunk, parent))
            os._exit(0)
        children.append(pid)

    def stop(*_):
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"listening {sock.getsockname()[1]}", flush=True)
    try:
        asyncio.run(serve(sock, args.tokens_per_chunk))
    finally:
        stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
