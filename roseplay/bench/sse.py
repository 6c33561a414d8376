"""One streamed request of `roseplay bench --base-url`: send, read the SSE stream, time it.

The client must not be the limit of what it measures (docs/SERVE.md "Performance"), so
the stream is read as raw bytes and each `data:` payload is decoded by msgspec into
small typed structs that hold only what the timings need (fields the bench does not read
are skipped, token ids are kept undecoded). No per-line str or dict objects.
Timings are vLLM benchmark_serving's: TTFT = first chunk carrying output - request
sent; ITL = gaps between such chunks; TPOT = (E2E - TTFT) / (output tokens - 1), output
tokens from the server's usage. Torch-free: client worker processes import only this.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import httpx
import msgspec


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    text: str | None = None
    delta: _Delta | None = None
    token_ids: msgspec.Raw = msgspec.Raw(b"null")   # only "any output?" is read: not decoded
    finish_reason: str | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class _Error(msgspec.Struct):
    message: str | None = None


class Chunk(msgspec.Struct):
    """The fields of an OpenAI completion / chat chunk (or error event) the bench reads."""
    choices: list[_Choice] = msgspec.field(default_factory=list)
    usage: _Usage | None = None
    error: _Error | None = None


_decode_chunk = msgspec.json.Decoder(Chunk).decode
EMPTY_IDS = (b"[]", b"null")


def has_output(choice: _Choice) -> bool:
    """A chunk choice that carries output: text, chat content, or (vLLM's
    return_token_ids extra) token ids whose text is still held back."""
    if choice.text or (choice.delta is not None and choice.delta.content):
        return True
    return bytes(choice.token_ids).replace(b" ", b"") not in EMPTY_IDS


class SSEParser:
    """Bytes in (any split), decoded `data:` payloads out; `done` after `data: [DONE]`."""

    def __init__(self):
        self._buf = b""
        self.done = False

    def feed(self, data: bytes) -> list[Chunk]:
        buf = self._buf + data
        if b"\r" in buf:                           # SSE allows CRLF line ends
            buf = buf.replace(b"\r\n", b"\n")
        *events, self._buf = buf.split(b"\n\n")
        out = []
        for event in events:
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue                       # comments, event:, id:, retry:
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    self.done = True
                elif payload:
                    out.append(_decode_chunk(payload))
        return out


@dataclass
class Outcome:
    index: int
    record: dict | None = None
    error: str | None = None
    times: list[float] = field(default_factory=list)


async def send(http: httpx.AsyncClient, path: str, body: dict, index: int,
               prompt_len: int | None) -> Outcome:
    out = Outcome(index)
    usage, finish = None, None
    parser = SSEParser()
    start = time.perf_counter()
    try:
        async with http.stream("POST", path, json=body) as r:
            if r.status_code != 200:
                await r.aread()
                out.error = f"HTTP {r.status_code}: {r.text[:300]}"
                return out
            async for data in r.aiter_raw():
                now = time.perf_counter()
                for chunk in parser.feed(data):
                    if chunk.error is not None:
                        out.error = str(chunk.error.message)
                    for choice in chunk.choices:
                        if has_output(choice):
                            out.times.append(now)
                        finish = choice.finish_reason or finish
                    usage = chunk.usage or usage
    except (httpx.HTTPError, msgspec.DecodeError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    if out.error is None:
        out.record = make_record(start, out.times, usage, prompt_len, finish)
    return out


def make_record(start: float, times: list[float], usage: _Usage | None,
                prompt_len: int | None, finish: str | None) -> dict:
    n_out = usage.completion_tokens if usage else len(times)
    n_prompt = usage.prompt_tokens if usage else (prompt_len or 0)
    ttft = times[0] - start if times else None
    e2e = times[-1] - start if times else None
    tpot = (e2e - ttft) / (n_out - 1) if times and n_out > 1 else None
    return {"prompt_len": n_prompt, "output_len": n_out, "ttft": ttft, "tpot": tpot,
            "e2e": e2e, "itls": [b - a for a, b in zip(times, times[1:])],
            "finish_reason": finish, "arrival_time": start,
            "last_token_time": times[-1] if times else None, "chunks": len(times)}
