"""`roseplay serve [engine flags] [--host] [--port] [--api-key] [--max-waiting] ...`

Engine flags come from engine/config.py (roseplay.cli_flags), so `serve` takes every
knob `roseplay` and `bench` take. The server binds 127.0.0.1 unless --host says otherwise.
"""
from __future__ import annotations

import argparse
import os
import sys

from engine.config import InvalidRequestError
from roseplay.cli_flags import add_engine_flags, engine_kwargs
from roseplay.serve.app import DEFAULT_MAX_BODY_BYTES, ServeConfig
from roseplay.serve.server import DEFAULT_HOST

EPILOG = """\
example (two terminals):
  roseplay serve --port 8000
  curl -s localhost:8000/v1/completions -H 'content-type: application/json' \\
       -d '{"model": "default", "prompt": "ROMEO.\\nWhat news?\\n\\nJULIET.\\n", "max_tokens": 32}'

status codes: 400 invalid parameters, 401 missing/wrong key (with --api-key), 404 unknown
model, 413 body over --max-body-bytes, 429 more than --max-waiting requests without a
first token yet (default: no cap, requests queue in the engine), 503 engine stopped.
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="roseplay serve", epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="An OpenAI-compatible server (/v1/completions, "
                                            "/v1/chat/completions, /v1/models, /health, "
                                            "/metrics) on the roseplay engine.")
    s = p.add_argument_group("server")
    s.add_argument("--host", default=DEFAULT_HOST, help="Address to bind (default: 127.0.0.1; "
                   "0.0.0.0 exposes the server to the network).")
    s.add_argument("--port", type=int, default=8000, help="Port (default: 8000).")
    s.add_argument("--api-key", default=os.environ.get("ROSEPLAY_API_KEY"),
                   help="Require 'Authorization: Bearer KEY' on /v1/* (default: "
                        "$ROSEPLAY_API_KEY, else no key).")
    s.add_argument("--served-model-name", nargs="+", default=None,
                   help="Model name(s) clients must send (default: the --model value).")
    s.add_argument("--max-waiting", type=int, default=None,
                   help="Refuse new requests with 429 while this many requests have no "
                        "first token yet (default: no cap; they queue in the engine).")
    s.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                   help=f"Largest request body; more gets 413 (default: {DEFAULT_MAX_BODY_BYTES}).")
    s.add_argument("--chat-template", default=None,
                   help="Jinja chat template (a file or the text) instead of the tokenizer's "
                        "(or, without one, the play template of docs/SERVE.md).")
    s.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    s.add_argument("--tui", action="store_true",
                   help="Also show the live TUI of the server's engine (not yet: see --help).")
    add_engine_flags(p)
    return p


def serve_config(args) -> ServeConfig:
    return ServeConfig(api_key=args.api_key or None,
                       served_model_name=tuple(args.served_model_name or ()),
                       max_waiting=args.max_waiting, max_body_bytes=args.max_body_bytes,
                       chat_template=args.chat_template)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.tui:   # hook: the lead attaches the TUI here (a ServerThread + the app in front)
        print("roseplay serve: --tui is not available yet (the TUI attaches to a server once "
              "the engine runs in its own process)", file=sys.stderr)
        return 2
    try:
        config = serve_config(args)
    except ValueError as exc:
        build_parser().error(str(exc))
    from engine.loop import EngineLoop        # lazy: --help needs no torch
    from roseplay.serve.app import build_app
    from roseplay.serve.server import serve_forever
    try:
        loop = EngineLoop(**engine_kwargs(args))
    except InvalidRequestError as exc:
        print(f"roseplay serve: {exc}", file=sys.stderr)
        return 2
    try:
        info = loop.info
        print(f"roseplay serve: {info.model_name} on {info.device} ({info.dtype}, "
              f"{info.num_blocks} KV blocks of {info.block_size}) at "
              f"http://{args.host}:{args.port}/v1", file=sys.stderr)
        serve_forever(build_app(loop, config), args.host, args.port, args.log_level)
    except KeyboardInterrupt:    # uvicorn re-raises Ctrl-C after its graceful shutdown
        pass
    except OSError as exc:
        print(f"roseplay serve: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
