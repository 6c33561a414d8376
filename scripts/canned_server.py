"""A server that streams canned OpenAI completion chunks as fast as it can: the load
client's ceiling (`roseplay bench --base-url`, scripts/client_ceiling.py) measured
without an engine, so the client's own limit is known before it measures one.

Raw asyncio HTTP/1.1 (keep-alive, chunked replies), chunks pre-encoded once: per event
it only writes bytes. POST /v1/completions streams `max_tokens` tokens, one chunk per
`--tokens-per-chunk` tokens, then the usage chunk and [DONE]; GET /v1/models names
dummy:tiny. `--workers N` forks N processes accepting on one socket. Prints
`listening PORT` once it accepts. SIGTERM or SIGINT, whenever it arrives, ends the server
(exit status 0) after its workers. Test and bench helper only, not a server to use.

    python scripts/canned_server.py --port 0 --workers 2
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys
import time
import traceback

import msgspec

MODEL = "dummy:tiny"
HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\ncache-control: no-cache\r\n\r\n")
DRAIN_EVERY = 16
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
CLOSE_S = 2.0            # the most a stopping server waits for its open connections
WORKER_EXIT_S = 5.0      # the most the parent waits for its SIGTERMed workers to go


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


async def serve(sock: socket.socket, per_chunk: int, until, announce: bool = False) -> None:
    """Accept on `sock` until the coroutine `until()` returns."""
    server = await asyncio.start_server(lambda r, w: handle(r, w, per_chunk), sock=sock,
                                        limit=1 << 20)
    try:
        if announce:
            print(f"listening {sock.getsockname()[1]}", flush=True)
        await until()
    finally:
        server.close()
        try:    # Python 3.12+ also waits for open connections here: a kept-alive client
            await asyncio.wait_for(server.wait_closed(), CLOSE_S)   # must not hold the exit
        except TimeoutError:
            pass


async def parent_gone(parent: int) -> None:
    while os.getppid() == parent:      # a worker ends with its parent, even a killed one
        await asyncio.sleep(0.5)


async def stop_requested(wake_fd: int) -> None:
    """Returns once a stop signal has written to the wakeup pipe, whenever it came: the byte
    waits in the pipe, so a signal from before the loop started is seen at once, and one
    that lands just before the loop blocks in epoll_wait still wakes it."""
    loop, woke = asyncio.get_running_loop(), asyncio.Event()
    loop.add_reader(wake_fd, woke.set)
    try:
        await woke.wait()
    finally:
        loop.remove_reader(wake_fd)


def end_workers(children: list[int]) -> None:
    """SIGTERM every worker and reap it; those not gone within WORKER_EXIT_S are SIGKILLed
    and reaped within as long again: the parent exits after its workers, and never waits
    on one without a bound."""
    left = set(children)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in left:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + WORKER_EXIT_S
        while left and time.monotonic() < deadline:
            left = {pid for pid in left if not reaped(pid)}
            if left:
                time.sleep(0.01)
        if not left:
            return


def reaped(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG)[0] != 0
    except ChildProcessError:
        return True


def worker(sock: socket.socket, per_chunk: int, parent: int, wake: tuple[int, int],
           mask) -> None:
    """A forked worker: dies at once on its own SIGTERM/SIGINT (the default action), serves
    until then or until its parent is gone, and never returns into the parent's code."""
    try:
        signal.set_wakeup_fd(-1)
        for fd in wake:
            os.close(fd)
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)   # a signal held since fork lands now
        asyncio.run(serve(sock, per_chunk, lambda: parent_gone(parent)))
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    os._exit(0)


def main(argv=None) -> int:
    # Stop signals are set up before anything else. Their handler only notes the signal;
    # the C-level handler also writes its number to the wakeup pipe, which the event loop
    # watches. Nothing raises out of a signal handler (no SystemExit mid-way through
    # asyncio's set-up or shutdown), no handler is ever removed, and a signal is never lost
    # between Python's check for pending signals and a blocking epoll_wait: a SIGTERM at any
    # moment, a second one too, ends the server through the one bounded shutdown path.
    wake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake[1], warn_on_full_buffer=False)
    stopping: list[int] = []
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda signum, _frame: stopping.append(signum))

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--workers", type=int, default=1, help="processes accepting on the socket")
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    args = ap.parse_args(argv)
    children: list[int] = []
    try:
        sock = socket.create_server((args.host, args.port), backlog=4096)
        parent = os.getpid()
        for _ in range(args.workers - 1):
            if stopping:
                break
            # Stop signals are held across fork: the parent records the pid before its
            # handler can run, and the child gets none until its own handlers are set.
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            try:
                pid = os.fork()
                if pid == 0:
                    worker(sock, args.tokens_per_chunk, parent, wake, mask)
                children.append(pid)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if not stopping:
            asyncio.run(serve(sock, args.tokens_per_chunk, lambda: stop_requested(wake[0]),
                              announce=True))
    finally:
        end_workers(children)
    return 0


if __name__ == "__main__":
    sys.exit(main())
