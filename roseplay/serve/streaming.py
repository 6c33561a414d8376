"""The SSE body of a streamed completion or chat: engine events -> `data: {json}` bytes.

Per-token work on the event loop was the server's limit under load (docs/SERVE.md
"Performance"): a pydantic chunk, a JSON encode and one socket write per token per
request. Here every event a Generation has queued when its reader wakes goes out in
ONE write, and the events of one choice are coalesced into one chunk (their text and
token ids joined: vLLM's stream interval, adaptive). An idle server still sends a
chunk per engine step; a loaded one sends fewer, larger chunks instead of falling
behind. Chunks are encoded by msgspec, each request's fixed fields (id, object,
created, model) once. The JSON is the pydantic models' (roseplay/serve/responses.py).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import msgspec

from roseplay.serve.errors import error_body
from roseplay.serve.responses import stop_reason

FINISH_REASONS = {"cancelled": "abort"}     # engine -> OpenAI/vLLM spelling
DONE = b"data: [DONE]\n\n"

_encode = msgspec.json.Encoder().encode


@dataclass
class Piece:
    """One choice's coalesced events of a batch."""
    choice: object
    text: str
    token_ids: list[int]
    finish_reason: str | None
    finished: bool
    logprobs: list | None = None    # TokenLogprobs per token (the request asked)
    prompt_logprobs: tuple | None = None   # echo + logprobs: the prompt's (first chunk)


def coalesce(batch) -> tuple[list[Piece], list[str]]:
    """(choice, StreamEvent) pairs -> one Piece per choice in first-seen order, and the
    error messages of failed choices (an error event each, as before)."""
    pieces: dict[int, Piece] = {}
    errors = []
    for c, event in batch:
        if event.finish_reason == "error":
            errors.append(event.error or "request failed")
            continue
        if not (event.text or event.token_ids or event.finished):
            continue
        p = pieces.get(c.index)
        lps = getattr(event, "logprobs", None)
        if p is None:
            pieces[c.index] = Piece(c, event.text, list(event.token_ids), event.finish_reason,
                                    event.finished, None if lps is None else list(lps),
                                    getattr(event, "prompt_logprobs", None))
        else:
            p.text += event.text
            p.token_ids.extend(event.token_ids)
            if lps is not None and p.logprobs is not None:
                p.logprobs.extend(lps)
            p.finish_reason, p.finished = event.finish_reason, event.finished
    return list(pieces.values()), errors


class ChunkEncoder:
    """Bytes of `data: {chunk}\\n\\n` for one request (completions or chat)."""

    def __init__(self, fmt):
        self.chat = fmt.prefix == "chatcmpl"
        self.ids = bool(fmt.req.return_token_ids)
        self.echo = fmt._echo if fmt.req.echo else None     # chat: vLLM's echo extra
        self.echo_only = fmt.req.echo_only
        self.first_prompt_token = lambda i: fmt.ins.prompts[i]["prompt_token_ids"][0]
        self.prompt_ids = fmt.prompt_ids
        self.logprobs = getattr(fmt, "logprobs", None)    # a LogprobsWriter
        # chat: the delta's fields and finish reason (tool calls read from the text:
        # roseplay/serve/routes.py ChatFormat.tool_delta)
        self.tool_delta = getattr(fmt, "tool_delta", _text_delta)
        head = {"id": fmt.id, "object": "chat.completion.chunk" if self.chat else
                "text_completion", "created": fmt.created, "model": fmt.model}
        self._head = b"data: " + _encode(head)[:-1] + b',"choices":['
        self._tail = b'],"usage":null}\n\n'
        # continuous usage: each choice's prompt length and output tokens so far
        self.continuous = fmt.req.continuous_usage
        self._prompt_len = lambda i: fmt.ins.prompt_lens[i // fmt.req.n]
        self._generated: dict[int, int] = {}

    def chunk(self, p: Piece, first: bool) -> bytes:
        if self.echo_only:      # the one sampled token is dropped (protocol echo_only)
            p = dataclasses.replace(p, text="", token_ids=[],
                                    logprobs=None if p.logprobs is None else [])
        index = p.choice.index
        self._generated[index] = self._generated.get(index, 0) + len(p.token_ids)
        echo = self.echo(index) if first and self.echo else ""
        reason = FINISH_REASONS.get(p.finish_reason, p.finish_reason)
        logprobs = self.logprobs.format(p.choice.index, p.logprobs) if self.logprobs else None
        if first and self.echo and p.prompt_logprobs is not None:
            logprobs = self.logprobs.echo(p.choice.index, self.first_prompt_token(p.choice.index),
                                          p.prompt_logprobs, p.logprobs)
        if self.chat:
            delta, reason = self.tool_delta(index, p.text, p.finished, reason)
            if echo:        # before the content, never read for tool calls
                delta["content"] = echo + (delta["content"] or "")
            if not (p.finished or self.ids or any(v is not None for v in delta.values())):
                return b""
            # the role in a choice's first delta only (OpenAI and vLLM leave it out after)
            choice = {"index": p.choice.index,
                      "delta": {"role": "assistant", **delta} if first else delta,
                      "logprobs": logprobs, "finish_reason": reason}
        else:
            choice = {"index": p.choice.index, "text": echo + p.text, "logprobs": logprobs,
                      "finish_reason": reason}
        # vLLM's extra: null until the chunk that ends the choice
        choice["stop_reason"] = stop_reason(p.choice) if p.finished else None
        tail = self._usage(index) if self.continuous else self._tail
        if self.ids:
            choice["token_ids"] = p.token_ids
            if first:       # vLLM's: in a choice's first chunk (chat: the chunk's field)
                ids = self.prompt_ids(index)
                if self.chat:
                    tail = tail[:-3] + b',"prompt_token_ids":' + _encode(ids) + b"}\n\n"
                else:
                    choice["prompt_token_ids"] = ids
        return self._head + _encode(choice) + tail

    def _usage(self, index: int) -> bytes:
        prompt, generated = self._prompt_len(index), self._generated[index]
        return b'],"usage":' + _encode({"prompt_tokens": prompt, "completion_tokens": generated,
                                        "total_tokens": prompt + generated}) + b"}\n\n"


def _text_delta(index: int, text: str, finished: bool, reason: str | None):
    """A chat delta without tools: the text as content."""
    return {"content": text}, reason


async def sse_body(gen, fmt, usage):
    """The SSE body; closing it early (client gone) cancels the unfinished choices.
    usage(): the Usage of the finished choices, for stream_options.include_usage. The
    last batch goes out in one write with the usage chunk and [DONE]."""
    enc, started, ended = ChunkEncoder(fmt), set(), False
    try:
        async for batch in gen.batches():
            pieces, errors = coalesce(batch)
            out = [f"data: {json.dumps(error_body(500, e))}\n\n".encode() for e in errors]
            for p in pieces:
                first = p.choice.index not in started
                chunk = enc.chunk(p, first)
                if chunk:           # (b"": a tool call's scaffolding, nothing to send yet)
                    started.add(p.choice.index)
                    out.append(chunk)
            if gen.done:
                out += _tail(fmt, usage)
                ended = True
            if out:
                yield b"".join(out)
        if not ended:
            yield b"".join(_tail(fmt, usage))
    finally:
        gen.close()


def usage_chunk(rid: str, obj: str, model: str, usage, created: int) -> bytes:
    """The `data: ...` line of stream_options.include_usage's last chunk (no choices)."""
    counts = {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
              "total_tokens": usage.total_tokens}
    if usage.prompt_tokens_details is not None:
        counts["prompt_tokens_details"] = usage.prompt_tokens_details.model_dump()
    return b"data: " + _encode({"id": rid, "object": obj, "created": created,
                                "model": model, "choices": [], "usage": counts}) + b"\n\n"


def _tail(fmt, usage) -> list[bytes]:
    if fmt.req.include_usage:
        return [fmt.usage_chunk(usage()), DONE]
    return [DONE]
