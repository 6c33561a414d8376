"""The engine-core process: the model, scheduler, KV cache and runner, and nothing else.

Three threads, as in vLLM V1's EngineCoreProc: the main thread runs the CoreLoop (it
only steps); an input thread decodes client messages into the core's own requests and
commands (engine/outputs.py, engine/commands.py) and posts them to the CoreLoop, which
applies them (`CoreLoop.handle`); an output thread encodes step outputs and snapshots
and sends them. Encoding, decoding and socket work never run inside a step. Text never
reaches this process. What this module adds to the core is the seam's own: who is
attached (authentication, heartbeats), who owns which request, and answers to senders.

Every socket is a CURVE server keyed by the engine key (engine/ipc/curve.py): a peer
without the key is dropped by libzmq before anything reaches this code. A key holder is
served once it said Hello, and tracked by heartbeat (engine/ipc/clients.py): one silent
for `client_timeout` seconds of this process's running time (EngineConfig; killed,
stopped, or gone without a Bye) has its requests ended with an error and their blocks
freed, its pause ends, and it is told so (Detached, also the answer to anything a
non-member sends): it can attach again. A Bye's requests are cancelled. When the engine
stops (its owner's Shutdown, SIGTERM, the owner's death, a fatal error) every request
still running ends with an error, and every client gets Fatal with the reason. A SIGTERM
to an owned engine stops it SIGTERM_GRACE_S later, unless its owner announced a drain
(Draining: it got the signal too, from a stop of the whole group): then at the owner's
Shutdown, or at the drain's end.
"""
from __future__ import annotations

import os
import signal
import threading
import time

import msgspec
import zmq

from engine.codes import ENGINE_CLOSED, REASON_CANCELLED, REASON_ERROR, REASON_STOP
from engine.commands import COMMANDS, Abort, Barrier, SetPaused, StepOnce
from engine.config import InvalidRequestError, check_priority, make_config
from engine.core.core_loop import CoreLoop
from engine.ipc import auth, curve
from engine.ipc.clients import ClientTable
from engine.ipc.core_output import CoreOutput
from engine.ipc.output_split import split_by_client
from engine.ipc.kv_publisher import KVEventPublisher
from engine.ipc.proc_setup import collect_when_idle, die_with_parent, time_collections
from engine.ipc import protocol as P
from engine.outputs import CoreRequest, EngineInfo, FinishedRequest, StepOutput
from engine.validation import check_prompt_ids, check_request_id

SNAPSHOT_INTERVAL = 1 / 15  # the UI pulls at 12 Hz: a faster rate only builds frames nobody draws
ABORT_REASONS = (REASON_CANCELLED, REASON_STOP, REASON_ERROR)
FLUSH_MS = 500    # at exit, the most time the last messages (ends, Fatal) get to go out
# an owned engine's SIGTERM waits this long for its owner's Draining: a signal sent to the
# whole group reaches both, and the owner's drain then needs the engine
SIGTERM_GRACE_S = 1.0
SIGTERM_REASON = "the engine process got SIGTERM"


class EngineCoreProc:
    def __init__(self, engine, address: str, owner_pid: int | None = None,
                 owner_token: str | None = None, engine_key: str | None = None):
        self.engine = engine
        self.kv_publisher = None
        self.kv_events: P.KVEventsEndpoints | None = None    # sent in every Welcome
        self.owner_pid = owner_pid
        self.owner_token = owner_token
        self.engine_key = engine_key or auth.new_key()
        self.ctx = zmq.Context()
        in_ep, out_ep, pub_ep = P.endpoints(address)
        self.in_sock = self._bind(zmq.ROUTER, in_ep,
                                  P.max_message_bytes(engine.max_model_len))
        # no high-water mark: a client stopped for less than client_timeout loses no
        # output (what queues for it is bounded by that time; then it is dropped)
        self.out_sock = self._bind(zmq.ROUTER, out_ep, P.CONTROL_MESSAGE_BYTES, {zmq.SNDHWM: 0})
        # a slow viewer drops frames; only the key's subscription is applied (manual)
        self.pub_sock = self._bind(zmq.XPUB, pub_ep, P.CONTROL_MESSAGE_BYTES,
                                   {zmq.SNDHWM: 2, zmq.XPUB_MANUAL: 1})
        self.core = CoreLoop(engine, self._on_output, SNAPSHOT_INTERVAL)
        self.core.publish_snapshots = False
        self.owner_of: dict[str, bytes] = {}          # request id -> client identity
        self.clients = ClientTable(engine.config.client_timeout)   # the attached ones
        self.output = CoreOutput(self.core, self.out_sock, self.pub_sock,
                                 auth.snapshot_topic(self.engine_key), self.clients.members,
                                 SNAPSHOT_INTERVAL / 4)
        self.core.on_snapshot = self.output.on_snapshot
        self.core.on_stats = lambda stats: self.output.put(None, P.Stats(stats))
        self._stop = threading.Event()
        self._sigterm_at: float | None = None       # SIGTERM's time, while it waits
        self._drain_until: float | None = None      # the owner's announced drain end
        if engine.kv_events is not None:
            self._start_kv_events(address)

    def _start_kv_events(self, address: str) -> None:
        """Publish the engine's KV events (kv_events_config) beside its sockets."""
        cfg = self.engine.config
        events, replay = P.kv_event_endpoints(address, cfg.kv_events_config,
                                              cfg.data_parallel_rank)
        self.kv_publisher = KVEventPublisher(cfg.kv_events_config, events, replay,
                                             self.engine_key, cfg.block_size,
                                             cfg.data_parallel_rank)
        self.engine.kv_events.sink = self.kv_publisher.publish
        self.kv_events = P.KVEventsEndpoints(*self.kv_publisher.bound,
                                             cfg.kv_events_config.topic)

    def _bind(self, kind: int, endpoint: str, max_bytes: int,
              options: dict | None = None) -> zmq.Socket:
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        curve.serve(sock, self.engine_key, max_bytes)
        for option, value in (options or {}).items():
            sock.setsockopt(option, value)
        sock.bind(endpoint)
        return sock

    # -- main ----------------------------------------------------------------------------
    def run(self) -> None:
        threads = [threading.Thread(target=self._input_loop, name="core-in", daemon=True),
                   threading.Thread(target=self.output.run, args=(self._stop,), name="core-out",
                                    daemon=True)]
        for t in threads:
            t.start()
        try:
            self.core.run()
        finally:
            if self.core.fatal_error:
                for client in self.clients.members():
                    self.output.put(client, P.Fatal(self.core.fatal_error))
            self._stop.set()           # the output thread sends what is queued, then ends
            for t in threads:
                t.join(2.0)
            if self.kv_publisher is not None:
                self.kv_publisher.close()
            self.ctx.destroy(linger=FLUSH_MS)

    # -- core thread callbacks -----------------------------------------------------------
    def _on_output(self, out: StepOutput) -> None:
        """One message per client per step (the core's thread; encoded on the output's)."""
        for client, part in split_by_client(out, self.owner_of):
            self.output.put(client, part)

    # -- input thread ----------------------------------------------------------------------
    def _input_loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.in_sock, zmq.POLLIN)
        while not self._stop.is_set() and not self.core.stopped:
            if poller.poll(100):
                while True:
                    try:
                        client, payload = self.in_sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    except ValueError:       # a frame count we never send: ignore it
                        continue
                    self.clients.heard(client)
                    self._dispatch(client, payload)
            self._check_clients()      # after draining: queued heartbeats count

    def _dispatch(self, client: bytes, payload: bytes) -> None:
        try:
            msg = P.client_decoder.decode(payload)
        except msgspec.ValidationError as exc:
            self._refuse_undecodable(client, payload, exc)
            return
        except msgspec.DecodeError:
            return        # not our protocol: the sender gets nothing
        if client not in self.clients and type(msg) not in _ANY_CLIENT:
            self.output.put(client, P.Detached(NOT_ATTACHED))   # not applied: say so
            return
        handler = _HANDLERS.get(type(msg))
        if handler is not None:
            handler(self, client, msg)
        elif isinstance(msg, COMMANDS):     # the rest concerns no client in particular
            self.core.post(msg)

    def _refuse_undecodable(self, client: bytes, payload: bytes,
                            exc: msgspec.ValidationError) -> None:
        """A key holder's CoreRequest with a wrong-typed or out-of-bounds field ends with an
        error naming the field; any other message that fails to decode changes nothing."""
        if client not in self.clients:
            return
        try:
            head = P.submit_head_decoder.decode(payload)
            check_request_id(head.request_id)
        except (msgspec.DecodeError, msgspec.ValidationError, InvalidRequestError):
            return
        if head.request_id not in self.owner_of:      # never end another's live request
            self._refuse(client, head.request_id, P.wire_error(exc))

    def _hello(self, client: bytes, msg: P.Hello) -> None:
        self.clients.admit(client)
        welcome = P.Welcome(EngineInfo.of(self.engine), self.engine.knobs, self.core.paused,
                            self.clients.timeout, self.kv_events, time.perf_counter())
        self.output.put(client, welcome)
        self.output.put(client, P.Stats(self.core.stats))

    def _submit(self, client: bytes, msg: CoreRequest) -> None:
        try:     # types and SamplingParams' bounds: checked by the decoder
            check_request_id(msg.request_id)
            check_priority(msg.priority)
            params = msg.params
            if params.max_tokens is None:
                raise InvalidRequestError("max_tokens None reached the engine: the front "
                                          "resolves it for the prompt (InputProcessor)")
            e = self.engine    # the process boundary re-checks what the front checked
            check_prompt_ids(msg.prompt_token_ids, params.max_tokens, e.vocab_size,
                             e.max_model_len, e.pool.num_blocks * e.pool.block_size,
                             e.pool.block_size, typed=True, logit_bias=params.logit_bias)
        except (InvalidRequestError, TypeError) as exc:
            self._refuse(client, msg.request_id, f"{exc}")
            return
        if msg.request_id in self.owner_of:
            self._refuse(client, msg.request_id, f"duplicate request id {msg.request_id!r}")
            return
        self.owner_of[msg.request_id] = client
        self.core.post(msg)

    def _refuse(self, client: bytes, request_id: str, error: str) -> None:
        fin = FinishedRequest(request_id, REASON_ERROR, error, 0.0, 0, 0)
        self.output.put(client, StepOutput(0.0, [], [], [fin]))

    def _abort(self, client: bytes, msg: Abort) -> None:
        """A client ends only its own requests, with a reason the front knows."""
        if self.owner_of.get(msg.request_id) == client and msg.reason in ABORT_REASONS:
            self.core.post(msg)

    def _shutdown(self, client: bytes, msg: P.Shutdown) -> None:
        """The owner's close: its own requests are cancelled (as at a Bye), everyone
        else's end with an error."""
        if self.owner_token is None or msg.token == self.owner_token:
            self._drop_client(client, REASON_CANCELLED, ENGINE_CLOSED)
            self.stop("the engine was shut down by its owner")

    def _draining(self, client: bytes, msg: P.Draining) -> None:
        if self.owner_token is None or msg.token == self.owner_token:
            self._drain_until = time.monotonic() + msg.seconds

    def on_sigterm(self) -> None:
        """Stop, unless an owner may be draining (a SIGTERM to the whole group): then
        wait for its Draining (SIGTERM_GRACE_S) and its Shutdown (up to the drain's end;
        _check_sigterm). The signal handler's: it only notes the time."""
        if self.owner_pid is None:
            self.stop(SIGTERM_REASON)
        elif self._sigterm_at is None:
            self._sigterm_at = time.monotonic()

    def _check_sigterm(self) -> None:
        if self._sigterm_at is None:
            return
        now, until = time.monotonic(), self._drain_until
        if until is not None and now >= until or \
                until is None and now - self._sigterm_at >= SIGTERM_GRACE_S:
            self.stop(SIGTERM_REASON)

    def stop(self, why: str) -> None:
        """Stop (any thread): the requests still running end with an error naming `why`
        (not a silent cancel: their clients did not ask for it), and every client
        still attached gets Fatal(why)."""
        if self.core.fatal_error is None:
            self.core.fatal_error = why
        self.core.stop()

    def _barrier(self, client: bytes, msg: Barrier) -> None:
        self.core.post(msg, lambda snap: self.output.put(
            client, P.BarrierDone(msg.token, P.encoder.encode(P.snapshot_frame(snap)))))

    def _set_paused(self, client: bytes, msg: SetPaused) -> None:
        self.clients.paused_by = client if msg.paused else None   # its pause ends with it
        self.core.post(msg)

    def _step_once(self, client: bytes, msg: StepOnce) -> None:
        self.clients.paused_by = client
        self.core.post(msg, lambda _: self.output.put(client, P.StepDone(msg.token)))

    def _bye(self, client: bytes, msg=None) -> None:
        self._drop_client(client, REASON_CANCELLED, "client left")

    def _drop_client(self, client: bytes, reason: str, error: str) -> None:
        """The client is gone: its requests end (`reason`), its pause ends."""
        member, held_pause = self.clients.remove(client)
        if not member:
            return
        for rid in [r for r, c in self.owner_of.items() if c == client]:
            self.core.post(Abort(rid, reason, error))
        if held_pause:
            self.core.post(SetPaused(False))

    def _check_clients(self) -> None:
        for client in self.clients.silent():
            why = (f"the engine heard nothing from this client for "
                   f"{self.clients.timeout:g} s (client_timeout) and dropped it")
            self._drop_client(client, REASON_ERROR, why)
            self.output.put(client, P.Detached(why))    # a stopped client reads it later
        if self.owner_pid is not None and os.getppid() != self.owner_pid:
            self.stop(f"the engine's owner (pid {self.owner_pid}) died")
        self._check_sigterm()


NOT_ATTACHED = "this client is not attached to the engine (dropped, or no Hello yet)"
_ANY_CLIENT = (P.Hello, P.Bye, P.Shutdown)    # the rest needs an attached client
_HANDLERS = {     # what concerns the sender (ownership, its pause, its answers)
    P.Hello: EngineCoreProc._hello,
    CoreRequest: EngineCoreProc._submit,
    Abort: EngineCoreProc._abort,
    SetPaused: EngineCoreProc._set_paused,
    StepOnce: EngineCoreProc._step_once,
    Barrier: EngineCoreProc._barrier,
    P.Heartbeat: lambda self, c, m: None,
    P.Bye: EngineCoreProc._bye,
    P.Shutdown: EngineCoreProc._shutdown,
    P.Draining: EngineCoreProc._draining,
}


def run_engine_core(engine_kwargs: dict, address: str, status, owner_pid: int | None,
                    owner_token: str | None = None, engine_key: str | None = None) -> None:
    """The engine-core process's work. status(kind, text) reports ("progress", text),
    then ("ready", address) or ("error", message). engine_key: the key clients must hold
    (None: a random one); either way it is written 0600 to the address's key file."""
    die_with_parent()
    if owner_pid is not None and os.getppid() != owner_pid:
        return        # the owner died before PDEATHSIG was armed (e.g. quit during imports)
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C goes to the client, which stops us
    try:
        config = make_config(**engine_kwargs)
        for endpoint in (address, *_kv_endpoints(address, config)):
            auth.check_bind(endpoint, key_given=engine_key is not None)
        curve.check_available()
        import torch
        # leave a core to the clients (the front, the UI): OpenMP threads that spin on a
        # busy small box slow every step many times over
        torch.set_num_threads(max(1, min(8, (os.cpu_count() or 2) - 1)))
        from engine.core.core import LLMEngine
        status("progress", f"loading {engine_kwargs.get('model', 'default')}")
        engine = LLMEngine(config)
        status("progress", "binding sockets")
        proc = EngineCoreProc(engine, address, owner_pid, owner_token, engine_key)
        key_file = auth.write_key(address, proc.engine_key)
    except Exception as exc:
        # launch.py raises the text as an InvalidRequestError: its own name is not repeated
        status("error", str(exc) if isinstance(exc, InvalidRequestError)
               else f"{type(exc).__name__}: {exc}")
        return
    signal.signal(signal.SIGTERM, lambda *a: proc.on_sigterm())
    time_collections(engine.counters)
    proc.core.on_idle = collect_when_idle()
    status("ready", address)
    try:
        proc.run()
    finally:
        auth.remove_key(*key_file)


def _kv_endpoints(address: str, config) -> tuple[str, ...]:
    if not config.kv_events_enabled:
        return ()
    events, replay = P.kv_event_endpoints(address, config.kv_events_config,
                                          config.data_parallel_rank)
    return (events,) if replay is None else (events, replay)


def main(argv: list[str] | None = None) -> int:
    """python -m engine.ipc.core_proc --address A --engine-json J [--owner-pid P] [--status-fd F]"""
    import argparse
    import json
    p = argparse.ArgumentParser(prog="python -m engine.ipc.core_proc",
                                description="Run the roseplay engine core in this process.")
    p.add_argument("--address", required=True, help="tcp://HOST:PORT or ipc:///PATH")
    p.add_argument("--engine-json", default="{}", help="engine knobs as a JSON object")
    p.add_argument("--owner-pid", type=int, default=None, help="stop when this process dies")
    p.add_argument("--status-fd", type=int, default=None, help="write JSON status lines here")
    p.add_argument("--owner-token", default=None, help="Shutdown must carry this (default: "
                   "anyone may stop the engine); read from the environment variable "
                   "ROSEPLAY_OWNER_TOKEN if unset")
    args = p.parse_args(argv)
    out = os.fdopen(args.status_fd, "w", buffering=1) if args.status_fd is not None else None

    def status(kind: str, text: str) -> None:
        line = json.dumps({"kind": kind, "text": text})
        if out is not None:
            try:
                out.write(line + "\n")
            except OSError:
                pass
        else:
            print(line, flush=True)
    token = args.owner_token or os.environ.pop("ROSEPLAY_OWNER_TOKEN", None)
    key = os.environ.pop(auth.ENGINE_KEY_ENV, None)    # never on the command line (ps)
    run_engine_core(json.loads(args.engine_json), args.address, status, args.owner_pid,
                    token, key)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
