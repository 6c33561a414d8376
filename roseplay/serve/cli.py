"""`roseplay serve [engine flags] [--host] [--port] [--api-key] [--max-waiting] ...`

Engine flags come from engine/config.py (roseplay.cli_flags), so `serve` takes every
knob `roseplay` and `bench` take. The server binds 127.0.0.1 unless --host says otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from engine.config import InvalidRequestError
from roseplay.cli_checks import check_model, check_serve_engine
from roseplay.cli_flags import (OneLineParser, add_engine_address_flag, add_engine_flags,
                                add_engine_key_flag, engine_addresses, engine_kwargs,
                                say_on_stderr)
from roseplay.serve import chat
from roseplay.serve.app import (DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_STREAM_BACKLOG,
                                ServeConfig)
from roseplay.serve.server import DEFAULT_HOST, url
from roseplay.serve.app import (DEFAULT_HTTP, DEFAULT_TIMEOUT_KEEP_ALIVE_S,
                                DEFAULT_TIMEOUT_REQUEST_READ_S, HTTP_PARSERS)
from roseplay.serve.multiproc import EXIT_API_SERVER_DIED
from roseplay.serve.shutdown import (DEFAULT_SHUTDOWN_TIMEOUT_S, EXIT_CUT, EXIT_DRAINED,
                                     EXIT_ENGINE_DIED)

EPILOG = """\
example (two terminals):
  roseplay serve --port 8000
  curl -s localhost:8000/v1/completions -H 'content-type: application/json' \\
       -d '{"model": "default", "prompt": "ROMEO.\\nWhat news?\\n\\nJULIET.\\n", "max_tokens": 32}'

status codes: 400 invalid parameters, 401 missing/wrong key (with --api-key), 404 unknown
model, 413 body over --max-body-bytes, 429 more than --max-waiting requests without a
first token yet (default: no cap, requests queue in the engine), 503 engine stopped or
server shutting down.

exit codes: %d stopped (SIGTERM/Ctrl-C) after every open request finished, %d stopped
with requests ended by an error at the --shutdown-timeout, %d the engine process failed
(every open request got an error first), %d an API-server process died
(--api-server-count), 2 bad flags or model.
""" % (EXIT_DRAINED, EXIT_CUT, EXIT_ENGINE_DIED, EXIT_API_SERVER_DIED)


def json_flag(example: str):
    """A flag's JSON reader (vLLM's --allowed-* flags take JSON lists,
    --default-chat-template-kwargs an object); ServeConfig checks what it holds."""
    def read(text: str):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            raise argparse.ArgumentTypeError(f"not JSON ({example}): {text!r:.60}") from None
    return read


def template_kwargs_flag(text: str) -> dict:
    """--default-chat-template-kwargs: a JSON object of template variables."""
    value = json_flag("an object, like '{\"enable_thinking\": false}'")(text)
    try:
        return chat.check_default_kwargs(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="roseplay serve", epilog=EPILOG,
                      formatter_class=argparse.RawDescriptionHelpFormatter,
                      description="An OpenAI-compatible server (/v1/completions, "
                                  "/v1/chat/completions, /v1/models, /health, /metrics) on "
                                  "the roseplay engine.")
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
    s.add_argument("--max-stream-backlog", type=int, default=DEFAULT_MAX_STREAM_BACKLOG,
                   metavar="TOKENS",
                   help="End a stream whose client leaves more than this many tokens unread "
                        "(each top logprob counts as one more) with an error event, and "
                        "cancel its requests: a client that reads slower than its tokens "
                        f"come holds no more server memory (default: {DEFAULT_MAX_STREAM_BACKLOG}).")
    s.add_argument("--shutdown-timeout", type=float, default=DEFAULT_SHUTDOWN_TIMEOUT_S,
                   help="On SIGTERM/Ctrl-C, stop accepting and let open requests finish for "
                        "this many seconds; then end the rest with an error event and [DONE] "
                        f"(default: {DEFAULT_SHUTDOWN_TIMEOUT_S:g}).")
    s.add_argument("--timeout-keep-alive", type=float, default=DEFAULT_TIMEOUT_KEEP_ALIVE_S,
                   help="Close an idle keep-alive connection after this many seconds "
                        f"(default: {DEFAULT_TIMEOUT_KEEP_ALIVE_S}).")
    s.add_argument("--timeout-request-read", type=float,
                   default=DEFAULT_TIMEOUT_REQUEST_READ_S,
                   help="Close a connection that has not sent a whole request (headers and "
                        "body) this many seconds after it opened or after its last response "
                        f"(slow clients; default: {DEFAULT_TIMEOUT_REQUEST_READ_S:g}).")
    s.add_argument("--http", choices=HTTP_PARSERS, default=DEFAULT_HTTP,
                   help="uvicorn's HTTP/1.1 parser (default: httptools, in C; h11 is pure "
                        "Python, about 1.5x the server's CPU per request).")
    s.add_argument("--chat-template", default=None,
                   help="Jinja chat template (a file or the text) instead of the tokenizer's "
                        "(or, without one, the play template of docs/SERVE.md).")
    s.add_argument("--default-chat-template-kwargs", metavar="JSON", default=None,
                   type=template_kwargs_flag,
                   help="Template variables every chat (and /tokenize of messages) gets, "
                        "as a JSON object (vLLM's flag), under the request's own "
                        "chat_template_kwargs, which win key by key; e.g. "
                        "'{\"enable_thinking\": false}' turns a reasoning model's thinking "
                        "off unless a request turns it on (default: none).")
    for name, default, what in (
            ("origins", "[]", "Origins a browser page may call the server from, as a JSON "
             "list (vLLM's flag; '[\"*\"]' for any). Default: none, no CORS: a server on "
             "127.0.0.1 without --api-key would otherwise answer any web page the user "
             "opens (vLLM's default is any)."),
            ("methods", '["*"]', "HTTP methods such pages may use, as a JSON list."),
            ("headers", '["*"]', "Request headers such pages may send, as a JSON list.")):
        s.add_argument(f"--allowed-{name}", type=json_flag("a list of strings, like '[\"*\"]'"),
                       default=json.loads(default),
                       metavar="JSON", help=f"{what} (default: {default}).")
    s.add_argument("--allowed-credentials", action="store_true",
                   help="Let such pages send cookies and authorization (CORS credentials).")
    s.add_argument("--enable-request-id-headers", action="store_true",
                   help="Send an X-Request-Id header with every response (vLLM's flag): "
                        "the request's X-Request-Id as sent, else the base of the "
                        "response's id (cmpl-BASE, chatcmpl-BASE, resp_BASE), else a new "
                        "one. Without it the request header still names the response's "
                        "id; engine ids stay unique whatever clients send.")
    s.add_argument("--return-tokens-as-token-ids", action="store_true",
                   help="Name each token of a response's logprobs 'token_id:N' instead of "
                        "its text (vLLM's flag), for requests that leave vLLM's "
                        "return_tokens_as_token_ids out: a token that is a piece of a "
                        "character is then told apart from its neighbours.")
    s.add_argument("--enable-prompt-tokens-details", action="store_true",
                   help="Add usage.prompt_tokens_details.cached_tokens, the prompt tokens "
                        "the prefix cache served, to responses where it served any "
                        "(vLLM's flag; the Responses API always has them).")
    s.add_argument("--enable-force-include-usage", action="store_true",
                   help="End every stream with its usage chunk, as stream_options "
                        "{\"include_usage\": true} asks (vLLM's flag).")
    s.add_argument("--exclude-tools-when-tool-choice-none", action="store_true",
                   help="Leave a chat's tools out of its template when its tool_choice is "
                        "none (vLLM's flag); without it the template shows them and the "
                        "model may only not call them.")
    s.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"],
                   help="The HTTP server's (uvicorn's) log level; no access log (default: info).")
    s.add_argument("--tui", action="store_true",
                   help="Show the live TUI of the server's engine in this terminal (the server "
                        "runs on a thread; quitting the TUI stops the server).")
    add_engine_address_flag(s)
    s.add_argument("--headless", action="store_true",
                   help="Run only the engine process, bound at the one --engine-address, "
                        "with no HTTP server, until SIGINT/SIGTERM: a replica for a front "
                        "that attaches to it (vLLM's --headless; docs/ROUTING.md \"Replicas "
                        "on other hosts\"). Takes engine flags, --engine-key, "
                        "--kv-events-config (which such a front needs).")
    add_engine_key_flag(s)
    s.add_argument("--in-process", action="store_true",
                   help="Run the engine on a thread of the server process (the old way).")
    s.add_argument("--api-server-count", type=int, default=1, metavar="N",
                   help="API-server processes on the one engine process (default: 1). With "
                        "N > 1 the kernel spreads connections over N processes on the same "
                        "host:port (SO_REUSEPORT), for when one server process's CPU is the "
                        "limit; /metrics sums them all (docs/SERVE.md \"Performance\").")
    add_engine_flags(p)
    return p


def serve_config(args) -> ServeConfig:
    return ServeConfig(api_key=args.api_key or None,
                       served_model_name=tuple(args.served_model_name or ()),
                       max_waiting=args.max_waiting, max_body_bytes=args.max_body_bytes,
                       max_stream_backlog=args.max_stream_backlog,
                       chat_template=args.chat_template,
                       default_chat_template_kwargs=args.default_chat_template_kwargs,
                       shutdown_timeout=args.shutdown_timeout,
                       timeout_keep_alive=args.timeout_keep_alive,
                       timeout_request_read=args.timeout_request_read, http=args.http,
                       allowed_origins=args.allowed_origins,
                       allowed_methods=args.allowed_methods,
                       allowed_headers=args.allowed_headers,
                       allowed_credentials=args.allowed_credentials,
                       enable_request_id_headers=args.enable_request_id_headers,
                       return_tokens_as_token_ids=args.return_tokens_as_token_ids,
                       enable_prompt_tokens_details=args.enable_prompt_tokens_details,
                       enable_force_include_usage=args.enable_force_include_usage,
                       exclude_tools_when_tool_choice_none=(
                           args.exclude_tools_when_tool_choice_none))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.headless:
            from roseplay.serve.headless import check_headless, run_headless
            check_headless(args, parser)
        else:
            config = serve_config(args)
            check_front_flags(args)
    except ValueError as exc:
        parser.error(str(exc))
    if problem := check_model(args.model) or check_serve_engine(args):   # before the slow start
        print(f"roseplay serve: {problem}", file=sys.stderr)
        return 2
    if args.headless:
        return run_headless(args)
    from roseplay.serve.app import build_app    # lazy: --help needs no engine
    try:
        loop = _engine(args)
    except (InvalidRequestError, RuntimeError) as exc:
        print(f"roseplay serve: {exc}", file=sys.stderr)
        return 2
    sock = None
    try:
        # bound before the banner, which then says the port it got (--port 0 picks one)
        sock = None if args.tui else _listen(args)
        port = sock.getsockname()[1] if sock is not None else args.port
        info = loop.info
        print(f"roseplay serve: {info.model_name} on {info.device} ({info.dtype}, "
              f"{info.num_blocks} KV blocks of {info.block_size}) at "
              f"{url(args.host, port)}/v1", file=sys.stderr)
        if line := defaults_line(info, bool(getattr(args, "override_generation_config", None))):
            print(f"roseplay serve: {line}", file=sys.stderr)
        address = getattr(loop, "address", None)
        if getattr(loop, "router", None) is not None:
            attached = [c.address for c in loop.replicas if c.proc is None]
            where = f" attached at {', '.join(attached)}" if attached else ""
            print(f"roseplay serve: {loop.size} engine replicas{where}, routing "
                  f"{loop.router.policy} (GET/POST /routing)", file=sys.stderr)
            if attached:
                print("roseplay serve: watch them live with `roseplay "
                      f"{' '.join('--connect ' + a for a in attached)}`", file=sys.stderr)
        if address:
            print(f"roseplay serve: watch it live with `roseplay --connect {address}`",
                  file=sys.stderr)
        if args.tui:
            return _serve_with_tui(build_app(loop, config), args, address)
        if args.api_server_count > 1:
            code = _serve_group(loop, config, args, sock)
        else:
            from roseplay.serve.server import serve_forever
            code = serve_forever(build_app(loop, config), args.host, port, args.log_level,
                                 sock=sock)
    except KeyboardInterrupt:    # a second Ctrl-C during the drain
        code = EXIT_CUT
    except OSError as exc:
        print(f"roseplay serve: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    except RuntimeError as exc:     # an API-server process did not start
        print(f"roseplay serve: {exc}", file=sys.stderr)
        return 1
    finally:
        if sock is not None:
            sock.close()
        loop.close()
    _report_exit(code, getattr(loop, "fatal_error", None))
    return code


def defaults_line(info, override: bool = False) -> str | None:
    """What vLLM's server logs at start when the model's generation config sets default
    sampling parameters (None when it sets none); `override`: --override-generation-config
    set some of them."""
    if not info.default_sampling_params:
        return None
    given = ", ".join(f"{k}={v}" for k, v in info.default_sampling_params.items())
    cap = "" if info.override_max_tokens is None else \
        f"; max_tokens {info.override_max_tokens} caps every request"
    source = "the model's Hugging Face generation config" + (
        " and --override-generation-config" if override else "")
    return (f"Default sampling parameters have been overridden by {source}: {given} (for "
            f"requests that leave them out{cap}); --generation-config vllm turns the "
            f"model's off")


def _listen(args):
    """The listening socket: SO_REUSEPORT when several API-server processes share it."""
    from roseplay.serve.server import bind
    return bind(args.host, args.port, reuse_port=args.api_server_count > 1)


def _report_exit(code: int, engine_error: str | None) -> None:
    if code == EXIT_ENGINE_DIED:
        print(f"roseplay serve: the engine failed ({engine_error}); every open request "
              f"got an error; exiting with {code} so a supervisor restarts the server",
              file=sys.stderr)
    elif code == EXIT_API_SERVER_DIED:
        print(f"roseplay serve: an API-server process died; stopped the others (exit code "
              f"{code})", file=sys.stderr)
    elif code == EXIT_CUT:
        print(f"roseplay serve: stopped; open requests were ended with an error at the "
              f"--shutdown-timeout (exit code {code})", file=sys.stderr)


# the data-parallel front's router: nothing to route with one engine
ROUTER_KNOBS = ("routing_policy", "kv_overlap_score_weight")


def check_front_flags(args) -> None:
    """ValueError for API-server and data-parallel flags that do not go together."""
    if args.api_server_count < 1:
        raise ValueError("--api-server-count must be >= 1")
    _, attached = engine_addresses(args)
    if attached and args.in_process:
        raise ValueError("--engine-address given more than once attaches to running engines: "
                         "not with --in-process")
    if (attached or (args.data_parallel_size or 1) > 1) and (args.api_server_count > 1
                                                             or args.tui):
        raise ValueError("data parallelism (--data-parallel-size > 1, or --engine-address "
                         "given more than once) runs one API server and no --tui (drop "
                         "--api-server-count / --tui)")
    routed = [name for name in ROUTER_KNOBS if getattr(args, name, None) is not None]
    if routed and not (attached or (args.data_parallel_size or 1) > 1):
        flags = ", ".join("--" + name.replace("_", "-") for name in routed)
        raise ValueError(f"{flags}: routes among engine replicas, and this server has one "
                         "engine (add --data-parallel-size N, or --engine-address once per "
                         "running engine)")
    if args.api_server_count > 1 and (args.tui or args.in_process):
        raise ValueError("--api-server-count > 1 needs the engine in its own process and "
                         "no --tui (drop --in-process / --tui)")


def _serve_group(loop, config, args, sock) -> int:
    """API server 0 here, 1..N-1 in processes of their own (multiproc.py), all on
    `sock`'s address (SO_REUSEPORT)."""
    from roseplay.serve.app import build_app
    from roseplay.serve.multiproc import ApiServerGroup
    from roseplay.serve.server import FLUSH_S, serve_forever
    try:
        group = ApiServerGroup(args.api_server_count, loop, config, args.host,
                               sock.getsockname()[1], args.log_level)
        try:
            app = build_app(loop, config)        # while the API servers start
            group.wait_ready()
            code = serve_forever(app, args.host, sock.getsockname()[1], args.log_level,
                                 sock=sock, watch=group.check, on_stop=group.stop)
            return group.wait(code, config.shutdown_timeout + 2 * FLUSH_S + 5)
        finally:
            group.close()
    finally:
        sock.close()


def _engine(args):
    kwargs = engine_kwargs(args)
    if args.in_process:
        if args.tui:
            raise InvalidRequestError("--tui needs the engine in its own process "
                                      "(drop --in-process)")
        from engine.front.loop import EngineLoop
        return EngineLoop(**kwargs)
    from engine.front.dp_client import engine_front
    address, attached = engine_addresses(args)
    progress = say_on_stderr("roseplay serve") if attached else None
    return engine_front(address=address, engine_addresses=attached, label="server",
                        snapshots=False, engine_key=args.engine_key, on_progress=progress,
                        **kwargs)


def _serve_with_tui(app, args, address: str) -> int:
    """The server on a thread, the TUI in front attached to the same engine (a second
    client: it sees every request the server's clients send)."""
    from roseplay.tui.app import RoseplayApp
    from roseplay.serve.server import ServerThread
    from roseplay.workload.source import start_live
    with ServerThread(app, args.host, args.port, log_level="warning"):     # (started)
        factory = lambda: start_live({}, connect=address)   # noqa: E731
        tui = RoseplayApp(source_factory=factory, loading_message=f"attaching to {address} …")
        tui.run()
        if tui.load_error:
            print(f"roseplay serve: {tui.load_error}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
