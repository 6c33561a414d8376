"""The endpoints: /v1/completions, /v1/chat/completions, /v1/models (and one model's card),
/health (and /ping), /metrics, /version, and vLLM's dev endpoint POST /reset_prefix_cache.

Both generation endpoints share one path (inputs -> Generation -> a Formatter that
writes the endpoint's JSON). Streaming is SSE (`data: {json}\\n\\n` ... `data: [DONE]`),
written by roseplay/serve/streaming.py: a chunk per engine step delta while the
server keeps up, coalesced per choice when it does not; TTFT at the client is the first
chunk. The chat role is sent with a choice's first tokens (not before), like vLLM, so a client's
first chunk really is the first token. A big non-streamed response is built on a worker
thread (`_json_response`); completions echo + logprobs with n > 1 computes the prompt's
logprobs once (roseplay/serve/siblings.py).
"""
from __future__ import annotations

import asyncio

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from roseplay import __version__
from roseplay.serve import prompts as inputs
from roseplay.serve.constrained import first_batch, grammar_error
from roseplay.serve.body import parse_body
from roseplay.serve.bridge import Generation, new_id
from roseplay.serve.errors import OpenAIError, error_body
from roseplay.serve.logprobs import LogprobsWriter, best_of
from roseplay.serve.protocol import ChatCompletionRequest, CompletionRequest, openapi_schemas
from roseplay.serve.responses import (ChatChoice, ChatCompletionResponse, ChatMessageOut,
                                      CompletionChoice, CompletionResponse, ModelCard, ModelList,
                                      stop_reason, usage)
from roseplay.serve.siblings import PromptLogprobs, SharedPromptLogprobs
from roseplay.serve.streaming import DONE, FINISH_REASONS, sse_body, usage_chunk
from roseplay.serve.tool_parsers import by_call, read_all

router = APIRouter()


class SSEResponse(StreamingResponse):
    """The SSE stream of one Generation. However the response ends, the generator is
    closed and the Generation's unfinished choices cancelled: a client that leaves while
    a chunk is being sent, or before the first one, stops its requests now (not when
    the generator is garbage collected, nor after max_tokens). The disconnect watch is
    one task, not Starlette's anyio task group of two (a share of the CPU per request)."""
    media_type = "text/event-stream"

    def __init__(self, gen: Generation, fmt):
        super().__init__(fmt.sse(gen), headers={"Cache-Control": "no-cache"})
        self.generation = gen

    async def __call__(self, scope, receive, send):
        watch = asyncio.ensure_future(_on_disconnect(receive, self.generation.abort))
        try:
            await self._stream(send)
        finally:
            watch.cancel()
            await self.body_iterator.aclose()
            self.generation.close()


    async def _stream(self, send) -> None:
        """As StreamingResponse.stream_response, but the chunk that ends with [DONE] is
        sent as the last one: uvicorn writes it and the chunked-body end at once."""
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        more = True
        async for chunk in self.body_iterator:
            more = not chunk.endswith(DONE)
            await send({"type": "http.response.body", "body": chunk, "more_body": more})
            if not more:
                break
        if more:
            await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _on_disconnect(receive, then) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    then()


def _state(request: Request):
    return request.app.state.serve


def _finish_reason(reason: str | None) -> str | None:
    return FINISH_REASONS.get(reason, reason)


class CompletionFormat:
    """What the generation path (`generate`) asks of an endpoint: the engine ids' prefix,
    the Generation as streamed (`streamed`), its SSE body (`sse`), the choices kept
    (`chosen`) and the JSON of the non-streamed response (`encode`)."""
    prefix = "cmpl"

    def __init__(self, req: CompletionRequest, rid: str, model: str, ins: inputs.EngineInputs,
                 tokenizer=None):
        self.req, self.id, self.model, self.ins = req, rid, model, ins
        self.logprobs = LogprobsWriter(tokenizer, req.num_logprobs,
                                       isinstance(req, ChatCompletionRequest))
        self.prompt_logprobs = PromptLogprobs(req.num_candidates)   # choice 0's, shared

    def _echo(self, index: int) -> str:
        return (self.ins.prompt_texts[index // self.req.n] or "") if self.req.echo else ""

    def _choice_logprobs(self, c) -> dict | None:
        if not self.req.echo or c.output is None:
            return self.logprobs.format(c.index, choice_logprobs(c))
        return self.logprobs.echo(c.index, c.output.prompt_token_ids[0],
                                  self.prompt_logprobs.get(c.index // self.req.n),
                                  None if self.req.echo_only else choice_logprobs(c))

    def streamed(self, gen):
        """The Generation as the SSE response reads it: with n > 1 and echo + logprobs,
        siblings wait for choice 0's prompt logprobs (roseplay/serve/siblings.py)."""
        shared = self.req.prompt_logprobs_asked is not None and self.req.n > 1
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
        return usage(sum(self.ins.prompt_lens), completion)

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
        return tokens * (1 if self.req.num_logprobs is None else 2 + self.req.num_logprobs)

    def usage_chunk(self, u) -> bytes:
        return usage_chunk(self.id, "text_completion", self.model, u)

    def response(self, choices, u) -> dict:
        generated = not self.req.echo_only
        out = [CompletionChoice(index=c.index,
                                text=self._echo(c.index) + choice_text(c) * generated,
                                finish_reason=_finish_reason(c.finish_reason),
                                stop_reason=stop_reason(c),
                                token_ids=(c.token_ids if generated else [])
                                if self.req.return_token_ids else None)
               for c in choices]
        body = CompletionResponse(id=self.id, model=self.model, choices=out, usage=u).model_dump()
        return _with_logprobs(body, [self._choice_logprobs(c) for c in choices])


class ChatFormat(CompletionFormat):
    prefix = "chatcmpl"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tools = self.req.tool_spec          # tool calling (roseplay/serve/tools.py)
        self.tool_streams: dict[int, object] = {}    # choice -> its streamed parser

    def usage_chunk(self, u) -> bytes:
        return usage_chunk(self.id, "chat.completion.chunk", self.model, u)

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
        if parser is None:
            return ChatMessageOut(content=choice_text(c)), reason
        content, calls = read_all(parser, choice_text(c))
        return ChatMessageOut(content=content or None, tool_calls=calls or None), \
            _tool_reason(self.tools, parser, reason)

    def response(self, choices, u) -> dict:
        out = []
        for c in choices:
            message, reason = self._message(c)
            out.append(ChatChoice(index=c.index, message=message, finish_reason=reason,
                                  stop_reason=stop_reason(c),
                                  token_ids=c.token_ids if self.req.return_token_ids else None))
        body = ChatCompletionResponse(id=self.id, model=self.model, choices=out,
                                      usage=u).model_dump()
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


def _first_error(choices) -> str | None:
    return next((c.error or "request failed" for c in choices if c.finish_reason == "error"), None)


async def _until_disconnect(request: Request, work):
    """Run `work` (a coroutine) unless the client disconnects first (then cancel it)."""
    async def disconnected():
        while (await request.receive())["type"] != "http.disconnect":
            pass
    task, watch = asyncio.ensure_future(work), asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
    return task.result() if task.done() and not task.cancelled() else None


async def generate(request: Request, fmt_cls, req, make_inputs):
    """One generation request of any endpoint: `req` (a SamplingFields) -> engine inputs
    (`make_inputs(req, state)`) -> engine requests -> the response `fmt_cls` writes
    (a CompletionFormat or subclass: SSE or JSON)."""
    st = _state(request)
    req.check_supported()
    model = st.check_model(req.model)
    # a long prompt on a worker thread: tokenizing it takes seconds (the tokenizer releases
    # the GIL); a short one here, the thread hop would cost more than the work
    ins = make_inputs(req, st) if inputs.on_loop(req) else \
        await asyncio.to_thread(make_inputs, req, st)
    rid = new_id(fmt_cls.prefix, req.user)
    fmt = fmt_cls(req, rid, model, ins, st.tokenizer)
    gen = st.bridge.start(rid, ins.prompts, ins.params, req.priority, req.data_parallel_rank)
    st.drain.add(gen)              # a shutdown waits for it, then ends it
    if req.stream:
        stream = fmt.streamed(gen)
        if req.constraint_field is not None:   # a refused grammar is a 400, not a 200
            stream = await _until_disconnect(request, first_batch(stream, req.constraint_field))
            if stream is None:
                gen.close()
                return Response(status_code=499)
        return SSEResponse(stream, fmt)
    try:
        choices = await _until_disconnect(request, gen.results())
    finally:
        gen.close()
    if choices is None:            # the client left; nobody reads this
        return Response(status_code=499)
    if (err := grammar_error(choices, req.constraint_field)) is not None:
        raise err
    if (err := _first_error(choices)) is not None:
        raise OpenAIError(getattr(gen, "error_status", 500), err)
    return await _json_response(fmt, fmt.chosen(choices))


# a response of more tokens (x logprobs entries) than this is built on a worker thread:
# echo + logprobs 20 + n 128 on a 1000-token prompt is 69 MiB of JSON, seconds of work
# that held /health and every stream on the event loop
ON_LOOP_RESPONSE_TOKENS = 4096
_encode_json = msgspec.json.Encoder().encode


async def _json_response(fmt, choices) -> Response:
    """The non-streamed response's JSON, encoded by msgspec; built off the event loop
    when it is big (the worker thread holds the GIL in turns of 5 ms, so the loop and
    its streams go on)."""
    big = fmt.response_size(choices) > ON_LOOP_RESPONSE_TOKENS
    body = await asyncio.to_thread(fmt.encode, choices) if big else fmt.encode(choices)
    return Response(body, media_type="application/json")


async def completions(request: Request):
    req = parse_body(CompletionRequest, await request.body())
    return await generate(request, CompletionFormat, req, lambda r, st: inputs.completion_inputs(
        r, st.tokenizer, st.max_model_len, st.vocab_size))


def chat_inputs(req: ChatCompletionRequest, st) -> inputs.EngineInputs:
    """A chat's engine inputs: its messages through the server's chat template."""
    return inputs.chat_inputs(req, st.tokenizer, st.chat_template, st.max_model_len)


async def chat_completions(request: Request):
    req = parse_body(ChatCompletionRequest, await request.body())
    return await generate(request, ChatFormat, req, chat_inputs)


# Plain Starlette routes: the body is msgspec's to decode, so FastAPI's request handler
# (dependency solving, exit stacks, response checks) would only add its ~60 us per
# request; /openapi.json gets their request schemas from openapi_paths().
GENERATE = {"/v1/completions": (completions, CompletionRequest),
            "/v1/chat/completions": (chat_completions, ChatCompletionRequest)}
for _path, (_endpoint, _) in GENERATE.items():
    router.add_route(_path, _endpoint, methods=["POST"], include_in_schema=False)


def openapi_paths(routes: dict) -> tuple[dict, dict]:
    """The OpenAPI paths of generation routes ({path: (endpoint, request model)}, as
    GENERATE) and the request schemas they refer to."""
    refs, components = openapi_schemas(tuple(model for _, model in routes.values()))
    paths = {path: {"post": {
        "summary": endpoint.__name__.replace("_", " ").capitalize(),
        "operationId": endpoint.__name__,
        "requestBody": {"required": True, "content": {"application/json": {"schema": ref}}},
        "responses": {"200": {"description": "The completion (JSON, or SSE with stream)"},
                      "400": {"description": "OpenAI error body naming the field (param)"}}}}
        for (path, (endpoint, _)), ref in zip(routes.items(), refs)}
    return paths, components


@router.get("/v1/models")
async def models(request: Request):
    st = _state(request)
    return JSONResponse(ModelList(data=[_card(st, name) for name in st.model_names]).model_dump())


def _card(st, name: str) -> ModelCard:
    return ModelCard(id=name, root=st.loop.info.model_name, max_model_len=st.max_model_len)


@router.get("/v1/models/{name:path}")
async def model(request: Request, name: str):
    """OpenAI's model retrieve (`client.models.retrieve`): the card, or model_not_found.
    A trailing slash is the app's 404 that names the route without it (no redirects)."""
    if not name or name.endswith("/"):
        raise StarletteHTTPException(404)
    st = _state(request)
    st.check_model(name)
    return JSONResponse(_card(st, name).model_dump())


@router.get("/version")
async def version():
    """vLLM's version endpoint: the server's version."""
    return JSONResponse({"version": __version__})


@router.get("/health")
@router.api_route("/ping", methods=["GET", "POST"], include_in_schema=False)  # /health's alias
async def health(request: Request):
    """200 while requests can be served; 503 while they cannot: the engine is gone, or
    it dropped this server, which is attaching again (engine/ipc/attach.py). /ping (GET
    and POST) is vLLM's alias, the probe SageMaker and some load balancers send."""
    st = _state(request)
    error = st.engine_error() or getattr(st.loop, "unavailable", None)
    if error:
        return JSONResponse(error_body(503, error), status_code=503)
    return Response(status_code=200)


@router.get("/metrics")
async def metrics(request: Request):
    return Response(_state(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.post("/reset_prefix_cache")
async def reset_prefix_cache(request: Request):
    """Drop the engine's cached prefix blocks (as vLLM's dev endpoint): a bench's repeated
    runs each start cold. Sent before any later request of this process reaches the
    engine; running requests keep their blocks (they are no longer found as prefixes)."""
    _state(request).loop.reset_prefix_cache()
    return Response(status_code=200)
