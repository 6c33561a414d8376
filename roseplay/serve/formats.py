"""How each generation endpoint writes its output: the format `routes.generate` asks for
the SSE body, the choices kept, the usage and the non-streamed JSON (CompletionFormat for
/v1/completions, ChatFormat for /v1/chat/completions; /v1/responses' builds on ChatFormat
in roseplay/serve/responses_events.py)."""
from __future__ import annotations

import time

import msgspec

from roseplay.serve import prompts as inputs
from roseplay.serve.logprobs import LogprobsWriter, best_of
from roseplay.serve.protocol import ChatCompletionRequest, CompletionRequest
from roseplay.serve.responses import (ChatChoice, ChatCompletionResponse, ChatMessageOut,
                                      CompletionChoice, CompletionResponse, PromptTokensDetails,
                                      stop_reason, usage)
from roseplay.serve.siblings import PromptLogprobs, SharedPromptLogprobs
from roseplay.serve.streaming import FINISH_REASONS, sse_body, usage_chunk
from roseplay.serve.tool_parsers import by_call, read_all

_encode_json = msgspec.json.Encoder().encode


def _finish_reason(reason: str | None) -> str | None:
    return FINISH_REASONS.get(reason, reason)


class CompletionFormat:
    """What the generation path (`generate`) asks of an endpoint: the engine ids' prefix,
    the Generation as streamed (`streamed`), its SSE body (`sse`), the choices kept
    (`chosen`) and the JSON of the non-streamed response (`encode`)."""
    prefix = "cmpl"

    def __init__(self, req: CompletionRequest, rid: str, model: str, ins: inputs.EngineInputs,
                 tokenizer=None, prompt_tokens_details: bool = False):
        """`prompt_tokens_details`: vLLM's --enable-prompt-tokens-details."""
        self.req, self.id, self.model, self.ins = req, rid, model, ins
        self.prompt_tokens_details = prompt_tokens_details
        # one creation time for every chunk of a stream (its usage chunk too) and the
        # response, as vLLM's: the request's
        self.created = int(time.time())
        self.logprobs = LogprobsWriter(tokenizer, req.num_logprobs,
                                       isinstance(req, ChatCompletionRequest),
                                       as_ids=bool(req.return_tokens_as_token_ids))
        self.prompt_logprobs = PromptLogprobs(req.num_candidates)   # choice 0's, shared
        self._prompt_lists: dict[int, list] = {}     # vLLM's prompt_logprobs, by prompt

    def _echo(self, index: int) -> str:
        return (self.ins.prompt_texts[index // self.req.n] or "") if self.req.echo else ""

    def prompt_ids(self, index: int) -> list[int] | None:
        """The prompt token ids of choice `index` (vLLM's prompt_token_ids), with
        return_token_ids; None without."""
        if not self.req.return_token_ids:
            return None
        first = index // self.req.n * self.req.num_candidates    # its prompt's first request
        return list(self.ins.prompts[first]["prompt_token_ids"])

    def _choice_logprobs(self, c) -> dict | None:
        if not self.req.echo or c.output is None:
            return self.logprobs.format(c.index, choice_logprobs(c))
        return self.logprobs.echo(c.index, c.output.prompt_token_ids[0],
                                  self.prompt_logprobs.get(c.index // self.req.n),
                                  None if self.req.echo_only else choice_logprobs(c))

    def streamed(self, gen):
        """The Generation as the SSE response reads it: with n > 1 and echo + logprobs,
        siblings wait for choice 0's prompt logprobs (roseplay/serve/siblings.py)."""
        shared = self.req.echo_logprobs is not None and self.req.n > 1
        return SharedPromptLogprobs(gen, self.req.n) if shared else gen

    def sse(self, gen):
        """The SSE body of the streamed Generation (roseplay/serve/streaming.py)."""
        return sse_body(gen, self, lambda: self.usage(gen.choices))

    def chosen(self, choices):
        """The finished choices the response shows: best_of's n best of its candidates
        (the prompt's logprobs kept for all first)."""
        self.prompt_logprobs.keep(choices)
        if self.req.num_candidates > self.req.n:
            return best_of(choices, self.req.n, self.req.num_candidates)
        return choices

    def usage(self, choices):
        completion = 0 if self.req.echo_only else sum(len(c.token_ids) for c in choices)
        u = usage(sum(self.ins.prompt_lens), completion)
        if self.prompt_tokens_details and (cached := self.cached_tokens(choices)):
            u.prompt_tokens_details = PromptTokensDetails(cached_tokens=cached)
        return u

    def cached_tokens(self, choices) -> int:
        """Prompt tokens the prefix cache served: each prompt's first choice's (its other
        choices share that prompt, as vLLM's n share one request's)."""
        first: dict[int, int] = {}
        for c in sorted(choices, key=lambda c: c.index):
            if c.output is not None:
                first.setdefault(c.index // self.req.n, c.output.metrics.num_cached_tokens)
        return sum(first.values())

    def encode(self, choices) -> bytes:
        """The non-streamed response's JSON, a choice at a time: no single encode holds
        the GIL for the whole response."""
        body = self.response(choices, self.usage(choices))
        body["choices"] = [msgspec.Raw(_encode_json(c)) for c in body["choices"]]
        return _encode_json(body)

    def response_size(self, choices) -> int:
        """Tokens the response writes, each with its logprobs entries: what building it
        costs (echo writes the prompt once per choice)."""
        echo = getattr(self.req, "echo", False)       # completions only
        echoed = sum(self.ins.prompt_lens) * self.req.n if echo else 0
        tokens = echoed + sum(len(c.token_ids) for c in choices)
        size = tokens * (1 if self.req.num_logprobs is None else 2 + self.req.num_logprobs)
        if self.req.prompt_logprobs is not None:
            size += sum(self.ins.prompt_lens) * self.req.n * (2 + self.req.prompt_logprobs)
        return size

    def usage_chunk(self, u) -> bytes:
        return usage_chunk(self.id, "text_completion", self.model, u, self.created)

    def response(self, choices, u) -> dict:
        generated = not self.req.echo_only
        out = [CompletionChoice(index=c.index,
                                text=self._echo(c.index) + choice_text(c) * generated,
                                finish_reason=_finish_reason(c.finish_reason),
                                stop_reason=stop_reason(c),
                                token_ids=(c.token_ids if generated else [])
                                if self.req.return_token_ids else None,
                                prompt_token_ids=self.prompt_ids(c.index))
               for c in choices]
        body = CompletionResponse(id=self.id, created=self.created, model=self.model,
                                  choices=out, usage=u).model_dump()
        if self.req.prompt_logprobs is not None:     # each choice its prompt's, as vLLM's
            for choice, c in zip(body["choices"], choices):
                choice["prompt_logprobs"] = self._prompt_logprobs(c.index // self.req.n)
        return _with_logprobs(body, [self._choice_logprobs(c) for c in choices])

    def _prompt_logprobs(self, prompt: int) -> list | None:
        """vLLM's prompt_logprobs of prompt `prompt` (formatted once, shared by its
        choices)."""
        lps = self.prompt_logprobs.get(prompt)
        if lps is None:
            return None
        done = self._prompt_lists.get(prompt)
        if done is None:
            done = self._prompt_lists[prompt] = self.logprobs.prompt(lps, self.req.prompt_logprobs)
        return done


class ChatFormat(CompletionFormat):
    prefix = "chatcmpl"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tools = self.req.tool_spec          # tool calling (roseplay/serve/tools.py)
        self.tool_streams: dict[int, object] = {}    # choice -> its streamed parser

    def usage_chunk(self, u) -> bytes:
        return usage_chunk(self.id, "chat.completion.chunk", self.model, u, self.created)

    def _echo(self, index: int) -> str:
        return self.req.echo_text

    def tool_delta(self, index: int, text: str, finished: bool, reason: str | None):
        """A streamed chunk's delta fields and finish reason (streaming.ChunkEncoder): the
        text read for tool calls, when the request has tools."""
        parser = self.tool_streams.get(index)
        if parser is None and self.tools is not None:
            parser = self.tool_streams[index] = self.tools.parser()
        if parser is None:
            return {"content": text}, reason
        content, calls = parser.feed(text)
        if finished:
            more, tail = parser.finish()
            content, calls = content + more, calls + tail
        delta = {"content": content or None}
        if calls:
            delta["tool_calls"] = [d.openai() for d in by_call(calls)]
        return delta, _tool_reason(self.tools, parser, reason)

    def _message(self, c) -> tuple[ChatMessageOut, str | None]:
        parser = self.tools.parser() if self.tools is not None else None
        reason = _finish_reason(c.finish_reason)
        echo = self._echo(c.index)
        if parser is None:
            return ChatMessageOut(content=echo + choice_text(c)), reason
        content, calls = read_all(parser, choice_text(c))
        return ChatMessageOut(content=echo + (content or "") or None, tool_calls=calls or None), \
            _tool_reason(self.tools, parser, reason)

    def response(self, choices, u) -> dict:
        out = []
        for c in choices:
            message, reason = self._message(c)
            out.append(ChatChoice(index=c.index, message=message, finish_reason=reason,
                                  stop_reason=stop_reason(c),
                                  token_ids=c.token_ids if self.req.return_token_ids else None))
        body = ChatCompletionResponse(id=self.id, created=self.created, model=self.model,
                                      choices=out, usage=u,
                                      prompt_token_ids=self.prompt_ids(0)).model_dump()
        if self.req.prompt_logprobs is not None:     # the response's, as vLLM's
            body["prompt_logprobs"] = self._prompt_logprobs(0)
        return _with_logprobs(body, [self.logprobs.format(c.index, choice_logprobs(c))
                                     for c in choices])


def _tool_reason(tools, parser, reason: str | None) -> str | None:
    """finish_reason "tool_calls" once the model called a tool (a named tool_choice keeps
    "stop", as OpenAI); a cut by length stays "length"."""
    if reason == "stop" and parser.called and tools.mode != "named":
        return "tool_calls"
    return reason


def _with_logprobs(body: dict, logprobs: list) -> dict:
    """The response's choices with their logprobs, set after the pydantic models (which
    give the shape) have been dumped: dumping would walk and copy every entry again."""
    for choice, lps in zip(body["choices"], logprobs):
        choice["logprobs"] = lps
    return body


def choice_text(c) -> str:
    return c.output.outputs[0].text if c.output is not None else ""


def choice_logprobs(c):
    return c.output.outputs[0].logprobs if c.output is not None else None
