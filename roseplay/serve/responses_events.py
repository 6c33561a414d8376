"""The Response object of POST /v1/responses and its SSE events (OpenAI's Responses API;
the request side is roseplay/serve/responses_api.py).

A response holds one output item, the assistant message, with one output_text part.
Its status is "completed", or "incomplete" with incomplete_details.reason
"max_output_tokens" where the length cap ended it (the engine's finish reason
"length"). A stream sends OpenAI's events, each `event: TYPE` and `data: {json}` with
a sequence_number from 0:

  response.created, response.in_progress                      at once
  response.output_item.added, response.content_part.added    with the first tokens
  response.output_text.delta                                 per engine step (coalesced)
  response.output_text.done, response.content_part.done,
  response.output_item.done, then response.completed         at the end
  (response.incomplete, as OpenAI, where the length cap ended it)

A request that fails in the engine (or is cut by a shutdown) ends with an `error`
event and response.failed. There is no `data: [DONE]` (OpenAI sends none here).
"""
from __future__ import annotations

import itertools

import msgspec

from roseplay.serve.constrained import decode_small
from roseplay.serve.formats import ChatFormat, choice_logprobs, choice_text
from roseplay.serve.streaming import coalesce

_encode = msgspec.json.Encoder().encode
INCOMPLETE = {"reason": "max_output_tokens"}


def _status(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


class ResponsesFormat(ChatFormat):
    """The chat path's format for /v1/responses (req: a ResponsesChat)."""
    prefix = "resp"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.source = self.req.source
        tail = self.id.split("-", 1)[1]
        self.response_id, self.item_id = "resp_" + tail, "msg_" + tail

    def response_object(self, status: str, output: list, usage: dict | None = None,
                        error: dict | None = None) -> dict:
        """The Response object: the output and usage, and the request's settings (the
        sampling ones as they ran, the model's defaults filled in, as vLLM's)."""
        src, params = self.source, self.ins.params[0]
        text = src.text_format()
        return {
            "id": self.response_id, "object": "response", "created_at": self.created,
            "status": status, "background": False, "error": error,
            "incomplete_details": INCOMPLETE if status == "incomplete" else None,
            "instructions": src.instructions, "max_output_tokens": params.max_tokens,
            "max_tool_calls": src.max_tool_calls, "metadata": src.metadata or {},
            "model": self.model, "output": output,
            "parallel_tool_calls": src.parallel_tool_calls, "previous_response_id": None,
            "reasoning": None, "service_tier": "default", "store": False,
            "temperature": params.temperature,
            "text": {"format": text or {"type": "text"}},
            "tool_choice": decode_small(src.tool_choice, "tool_choice") or "auto", "tools": [],
            "top_logprobs": src.top_logprobs or 0,
            "top_p": params.top_p,
            "truncation": "disabled", "usage": usage, "user": src.user}

    def message(self, text: str, status: str, logprobs: list | None = None) -> dict:
        return {"id": self.item_id, "type": "message", "role": "assistant", "status": status,
                "content": [self.part(text, logprobs)]}

    def part(self, text: str, logprobs: list | None = None) -> dict:
        return {"type": "output_text", "text": text, "annotations": [],
                "logprobs": logprobs or []}

    def logprob_entries(self, entries) -> list | None:
        """Logprobs as output_text carries them (chat's content entries)."""
        lps = self.logprobs.format(0, entries)
        return lps["content"] if lps is not None else None

    def usage_object(self, choices) -> dict:
        u = self.usage(choices)
        return {"input_tokens": u.prompt_tokens,
                "input_tokens_details": {"cached_tokens": self.cached_tokens(choices)},
                "output_tokens": u.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": u.total_tokens}

    def finished(self, choices) -> dict:
        """The Response of finished choices (one: a response has one output message)."""
        c = choices[0]
        status = _status(c.finish_reason)
        message = self.message(choice_text(c), status, self.logprob_entries(choice_logprobs(c)))
        return self.response_object(status, [message], self.usage_object(choices))

    def encode(self, choices) -> bytes:
        return _encode(self.finished(choices))

    def sse(self, gen):
        return responses_sse(self, gen)


class Events:
    """`event: TYPE` / `data: {json}` lines, numbered from 0 (sequence_number)."""

    def __init__(self):
        self._seq = itertools.count()

    def __call__(self, kind: str, **fields) -> bytes:
        data = _encode({"type": kind, "sequence_number": next(self._seq), **fields})
        return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


async def responses_sse(fmt: ResponsesFormat, gen):
    """The SSE body of a streamed response; closing it early (client gone) cancels the
    request (gen.close())."""
    event = Events()
    part = {"output_index": 0, "item_id": fmt.item_id, "content_index": 0}
    opened, ended, held = False, False, []
    try:
        start = fmt.response_object("in_progress", [])
        yield event("response.created", response=start) + event("response.in_progress",
                                                                  response=start)
        async for batch in gen.batches():
            pieces, errors = coalesce(batch)
            out = []
            for p in pieces:
                if not opened:
                    out += _opening(fmt, event, part)
                    opened = True
                held += p.logprobs or ()
                if p.text:      # tokens without text yet give their logprobs to the next
                    out.append(event("response.output_text.delta", **part, delta=p.text,
                                     logprobs=fmt.logprob_entries(held) or []))
                    held = []
            if errors:
                out += _failed(fmt, event, errors[0])
                ended = True
            elif gen.done and not _left(gen):
                out += _done(fmt, event, part, gen.choices, opened, held)
                ended = True
            if out:
                yield b"".join(out)
            if ended:
                return
        if not ended and not _left(gen):
            yield b"".join(_done(fmt, event, part, gen.choices, opened, held))
    finally:
        gen.close()


def _left(gen) -> bool:
    """The client left (the server cancelled the request): nobody reads an ending."""
    return any(c.finish_reason == "cancelled" for c in gen.choices)


def _opening(fmt: ResponsesFormat, event: Events, part: dict) -> list[bytes]:
    """The message item and its output_text part, empty: sent with the first tokens."""
    return [event("response.output_item.added", output_index=0,
                  item={**fmt.message("", "in_progress"), "content": []}),
            event("response.content_part.added", **part, part=fmt.part(""))]


def _done(fmt: ResponsesFormat, event: Events, part: dict, choices, opened: bool,
          held: list) -> list[bytes]:
    """The ending events. Logprobs still held (a stop string's tokens: no text to send)
    go out in an empty delta first, as vLLM's chat sends them in its last chunk: the
    deltas' logprobs are then the final object's."""
    final = fmt.finished(choices)
    item = final["output"][0]
    out = [] if opened else _opening(fmt, event, part)
    if held:
        out.append(event("response.output_text.delta", **part, delta="",
                         logprobs=fmt.logprob_entries(held) or []))
    content = item["content"][0]
    return out + [
        event("response.output_text.done", **part, text=content["text"],
              logprobs=content["logprobs"]),
        event("response.content_part.done", **part, part=content),
        event("response.output_item.done", output_index=0, item=item),
        event("response.completed" if final["status"] == "completed" else "response.incomplete",
              response=final)]


def _failed(fmt: ResponsesFormat, event: Events, message: str) -> list[bytes]:
    error = {"code": "server_error", "message": message}
    return [event("error", code="server_error", message=message, param=None),
            event("response.failed", response=fmt.response_object("failed", [], error=error))]
