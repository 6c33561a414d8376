"""The endpoints: /v1/completions, /v1/chat/completions (and SageMaker's /invocations,
which takes either body), /v1/models (and one model's card), /health (and /ping),
/metrics, /version, and vLLM's dev endpoint POST /reset_prefix_cache.

Both generation endpoints share one path (inputs -> Generation -> a format that
writes the endpoint's JSON: roseplay/serve/formats.py). Streaming is SSE (`data: {json}\\n\\n` ... `data: [DONE]`),
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

from engine.config import InvalidRequestError
from roseplay import __version__
from roseplay.serve import prompts as inputs
from roseplay.serve import request_ids
from roseplay.serve.body import json_body
from roseplay.serve.bridge import Generation
from roseplay.serve.constrained import (check_constraint, check_on_loop, first_batch,
                                        grammar_error, refused_at_submit)
from roseplay.serve.errors import OpenAIError, error_body, invalid
from roseplay.serve.formats import ChatFormat, CompletionFormat
from roseplay.serve.protocol import ChatCompletionRequest, CompletionRequest, openapi_schemas
from roseplay.serve.responses import ModelCard, ModelList
from roseplay.serve.streaming import DONE

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
        self.generation.writing = True     # a drain waits for the last byte, not event
        try:
            await self._stream(send)
        except asyncio.CancelledError:
            if not scope["app"].state.serve.drain.draining:
                raise
            # past the drain, uvicorn cancels a write its client never took: nobody reads
            # this stream, and uvicorn closes it (a line of log, not a traceback)
        finally:
            self.generation.writing = False
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
    if req.return_tokens_as_token_ids is None:
        req.return_tokens_as_token_ids = st.config.return_tokens_as_token_ids
    if st.config.enable_force_include_usage:
        req.force_include_usage()
    # a long prompt on a worker thread: tokenizing it takes seconds (the tokenizer releases
    # the GIL); so is a constraint whose check at submit is slow (constrained.py); a short
    # one here, the thread hop would cost more than the work
    if inputs.on_loop(req) and check_on_loop(req.constraint, st.grammar_backend):
        ins = make_inputs(req, st)
    else:
        ins = await asyncio.to_thread(_checked_inputs, make_inputs, req, st)
    ids = request_ids.assign(fmt_cls.prefix, req.user,
                             request_ids.client_id(request, req.request_id))
    request_ids.note(request, ids)
    fmt = fmt_cls(req, ids.response, model, ins, st.tokenizer,
                  st.config.enable_prompt_tokens_details)
    try:
        gen = st.bridge.start(ids.engine, ins.prompts, ins.params, req.priority,
                              data_parallel_rank(request, req.data_parallel_rank))
    except InvalidRequestError as exc:     # (a grammar its library cannot read, say)
        raise refused_at_submit(exc, req.constraint_field) from None
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


def _checked_inputs(make_inputs, req, st) -> inputs.EngineInputs:
    """The engine inputs, and the front's check of the constraint done ahead of the submit
    (on a worker thread, where both go)."""
    ins = make_inputs(req, st)
    check_constraint(req.constraint, st.grammar_backend, req.constraint_field)
    return ins


DP_RANK_HEADER = "x-data-parallel-rank"


def data_parallel_rank(request: Request, body_rank: int | None) -> int | None:
    """The replica a request pins: vLLM's X-data-parallel-rank header (what routers in
    front of vLLM send), else the body's data_parallel_rank; None: the router chooses.
    A header that is no integer is a 400 (vLLM ignores it)."""
    header = request.headers.get(DP_RANK_HEADER)
    if header is None:
        return body_rank
    if not header.strip().isdecimal() or not header.strip().isascii():
        raise invalid(f"the X-data-parallel-rank header must be a replica's rank (an "
                      f"integer), got {header[:40]!r}", "data_parallel_rank")
    return int(header)


# a response of more tokens (x logprobs entries) than this is built on a worker thread:
# echo + logprobs 20 + n 128 on a 1000-token prompt is 69 MiB of JSON, seconds of work
# that held /health and every stream on the event loop
ON_LOOP_RESPONSE_TOKENS = 4096


async def _json_response(fmt, choices) -> Response:
    """The non-streamed response's JSON, encoded by msgspec; built off the event loop
    when it is big (the worker thread holds the GIL in turns of 5 ms, so the loop and
    its streams go on)."""
    big = fmt.response_size(choices) > ON_LOOP_RESPONSE_TOKENS
    body = await asyncio.to_thread(fmt.encode, choices) if big else fmt.encode(choices)
    return Response(body, media_type="application/json")


async def completions(request: Request):
    req = await json_body(request, CompletionRequest)
    return await generate(request, CompletionFormat, req, lambda r, st: inputs.completion_inputs(
        r, st.tokenizer, st.max_model_len, st.vocab_size, st.sampling_defaults))


def chat_inputs(req: ChatCompletionRequest, st) -> inputs.EngineInputs:
    """A chat's engine inputs: its messages through the server's chat template."""
    return inputs.chat_inputs(req, st.tokenizer, st.chat_template, st.max_model_len,
                              st.sampling_defaults, st.template_defaults,
                              st.config.exclude_tools_when_tool_choice_none)


async def chat_completions(request: Request):
    req = await json_body(request, ChatCompletionRequest)
    return await generate(request, ChatFormat, req, chat_inputs)


class _Invocation(msgspec.Struct):
    """What /invocations reads first: which endpoint's body it is."""
    messages: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    prompt: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


async def invocations(request: Request):
    """SageMaker's inference route (vLLM's): a body with `messages` is a chat completion,
    one with `prompt` a completion (chat first, as vLLM tries them); anything else a 400
    naming both fields."""
    body = await json_body(request, _Invocation)
    if body.messages is not msgspec.UNSET:
        return await chat_completions(request)
    if body.prompt is not msgspec.UNSET:
        return await completions(request)
    raise invalid("/invocations takes a chat completion (messages) or a completion "
                  "(prompt) request body; this one has neither", "messages")


# Plain Starlette routes: the body is msgspec's to decode, so FastAPI's request handler
# (dependency solving, exit stacks, response checks) would only add its ~60 us per
# request; /openapi.json gets their request schemas from openapi_paths().
GENERATE = {"/v1/completions": (completions, CompletionRequest),
            "/v1/chat/completions": (chat_completions, ChatCompletionRequest)}
for _path, (_endpoint, _) in GENERATE.items():
    router.add_route(_path, _endpoint, methods=["POST"], include_in_schema=False)
router.add_route("/invocations", invocations, methods=["POST"], include_in_schema=False)


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
