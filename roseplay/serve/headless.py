"""`roseplay serve --headless --engine-address ADDR [engine flags]`: the engine process
alone (vLLM's --headless), no HTTP server, serving at ADDR until SIGINT/SIGTERM, for a
front on another host to attach to (`roseplay serve --engine-address A --engine-address
B`, docs/ROUTING.md "Replicas on other hosts").

This process owns the engine process (engine/ipc/launch.py): the engine dies with it,
and a signal here stops the engine (its clients' open requests end with an error).
"""
from __future__ import annotations

import signal
import socket
import sys

from engine.config import InvalidRequestError
from engine.ipc import auth
from engine.ipc import protocol as P
from engine.ipc.launch import EngineDied, EngineLaunch, stop_engine, wait_ready
from engine.ipc.zmq_transport import STARTUP_TIMEOUT
from roseplay.cli_flags import engine_kwargs
from roseplay.serve.shutdown import EXIT_DRAINED, EXIT_ENGINE_DIED

# the server's flags and the front's knobs: nothing to do with an engine alone
NOT_HEADLESS = ("host", "port", "api_key", "served_model_name", "max_waiting",
                "max_body_bytes", "max_stream_backlog", "shutdown_timeout", "timeout_keep_alive",
                "timeout_request_read", "http", "chat_template",
                "default_chat_template_kwargs", "allowed_origins",
                "allowed_methods", "allowed_headers", "allowed_credentials",
                "enable_request_id_headers", "return_tokens_as_token_ids",
                "enable_prompt_tokens_details", "enable_force_include_usage",
                "exclude_tools_when_tool_choice_none", "tui",
                "in_process",
                "api_server_count", "data_parallel_size", "routing_policy",
                "kv_overlap_score_weight")


def check_headless(args, parser) -> None:
    """ValueError naming what --headless cannot take: one --engine-address is needed; a
    server flag, or a front's (routing, replica count), has nothing to serve."""
    if len(args.engine_address or ()) != 1:
        raise ValueError("--headless runs one engine: give exactly one --engine-address "
                         "(tcp://HOST:PORT, or ipc:///PATH) where it binds")
    given = [name for name in NOT_HEADLESS if getattr(args, name) != parser.get_default(name)]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise ValueError(f"{flags}: not with --headless (it runs the engine alone: no HTTP "
                         "server, no router; give these to the front that attaches)")


class _Stop(Exception):
    """SIGINT or SIGTERM: stop the engine."""


def _raise_stop(signum, frame):
    raise _Stop()


def run_headless(args) -> int:
    """Start the engine, say how to attach, wait for a signal or the engine's end."""
    address = args.engine_address[0]
    try:
        launch = EngineLaunch(engine_kwargs(args), address, args.engine_key)
    except InvalidRequestError as exc:
        print(f"roseplay serve: {exc}", file=sys.stderr)
        return 2
    old = {s: signal.signal(s, _raise_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            wait_ready(launch.proc, launch.status,
                       lambda text: print(f"roseplay serve: {text}", file=sys.stderr),
                       STARTUP_TIMEOUT)
        except (InvalidRequestError, EngineDied) as exc:
            print(f"roseplay serve: {exc}", file=sys.stderr)
            return 2
        _say_ready(launch, address, args.engine_key)
        code = launch.proc.wait()
        print(f"roseplay serve: the engine process ended (exit code {code})", file=sys.stderr)
        return EXIT_ENGINE_DIED
    except _Stop:
        print("roseplay serve: stopping the engine", file=sys.stderr)
        return EXIT_DRAINED
    finally:
        for s, handler in old.items():     # a second signal must not cut the stop short
            signal.signal(s, signal.SIG_IGN)
        stop_engine(launch.proc, launch.tmpdir, address)
        for s, handler in old.items():
            signal.signal(s, handler)


def _say_ready(launch: EngineLaunch, address: str, engine_key: str | None) -> None:
    cfg = launch.config
    if cfg.kv_events_enabled:
        events, replay = P.kv_event_endpoints(address, cfg.kv_events_config,
                                              cfg.data_parallel_rank)
        kv = f"KV events at {events}" + (f" (replay {replay})" if replay else "")
    else:
        kv = ("KV events off: a data-parallel front needs them (add "
              "--kv-events-config '{\"enable_kv_cache_events\": true}')")
    key = ("--engine-key KEY (the key given here)" if auth.given_key(engine_key) else
           f"(its key is in {auth.key_file(address)}, for this user on this host)")
    print(f"roseplay serve: headless engine {cfg.model} at {address}; {kv}\n"
          f"roseplay serve: attach a front: roseplay serve --engine-address {_reach(address)} "
          f"--engine-address ADDR2 ... {key}\n"
          f"roseplay serve: watch it: roseplay --connect {address}; stop: Ctrl-C or SIGTERM",
          file=sys.stderr, flush=True)


def _reach(address: str) -> str:
    """The address a front on another host gives: a wildcard bind named by this host."""
    if not address.startswith("tcp://"):
        return address
    host, _, port = address[len("tcp://"):].rpartition(":")
    return f"tcp://{socket.gethostname()}:{port}" if host in P.WILDCARD_HOSTS else address
