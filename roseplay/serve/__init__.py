"""`roseplay serve`: an OpenAI-compatible HTTP server on the engine (FastAPI + uvicorn).

Modules, one job each:
  protocol.py   OpenAI request models (msgspec, decoded from the raw body); request ->
                SamplingParams
  messages.py   the request models' base (OpenAI's nulls) and a chat's messages
  responses.py  OpenAI response models (pydantic)
  errors.py     OpenAI error JSON, status mapping, API-key check, body-size limit
  chat.py       chat templates (the tokenizer's, or the bundled model's own)
  request_ids.py  response and engine ids (X-Request-Id, vLLM's request_id), the echo
  bridge.py     engine events -> asyncio (a Mailbox: one wake-up per batch), cancellation
  streaming.py  the SSE body: queued events coalesced per choice, msgspec-encoded chunks
  metrics.py    Prometheus metrics with vLLM's names
  routes.py     /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics
  formats.py    how completions and chat write their output (SSE body, usage, JSON)
  responses_api.py     /v1/responses (OpenAI's Responses API): request -> the chat it runs as
  responses_events.py  the Response object and its SSE events
  server_info.py  /server_info: the model a worker serves, for routers in front (SGLang's)
  app.py        build_app(loop, ServeConfig): the FastAPI app
  server.py     uvicorn in a thread (tests) or in the foreground (the CLI)
  cli.py        `roseplay serve [engine flags] [--host] [--port] [--api-key] ...`

The server only uses the engine's front API (EngineLoop.submit/cancel/snapshot/info/
tokenizer/knobs/set_knobs/close), so an engine-process client with the same surface
can replace the in-process loop.
"""
