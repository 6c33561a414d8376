"""The `roseplay` command: no subcommand opens the TUI; `roseplay bench ...` benchmarks.

Engine flags come from engine/config.py through roseplay.cli_flags (each knob defined
once). The bench subcommand is imported only when asked for, and `--replay` never loads
a model (nor torch).
"""
from __future__ import annotations

import argparse
import os
import sys

from roseplay.cli_flags import (add_engine_flags, add_engine_key_flag, add_goodput_flag,
                                engine_kwargs, goodput_slos)
from roseplay.tui.defaults import TUI_MAX_NUM_SEQS, TUI_NUM_BLOCKS
from roseplay.tui.early_start import EarlyStart
from roseplay.workload.flags import WORKLOAD_DEFAULTS, add_workload_flags, number

DESCRIPTION = ("An interactive terminal playground on a real LLM inference engine (its own process, "
               "two with --compare): "
               "paged KV blocks, prefix-cache sharing, chunked prefill and per-token timing, "
               "live, while you turn the knobs.")
EPILOG = """\
commands:
  roseplay bench ...      benchmark the engine (vLLM benchmark_serving style);
                          see `roseplay bench --help`
  roseplay serve ...      an OpenAI-compatible server on the engine;
                          see `roseplay serve --help`

keys in the app: space pause/resume · n one step · c prefix cache · -/+ token budget
(halve/double) · [/] max running seqs · m/M scheduling mode · p/P queue policy ·
e eviction policy · s/S scenario · </> concurrency · r/R rate ·
x clear prefix cache · i type a prompt · o/f sort/filter requests · z zoom a panel ·
l goodput SLOs · 0 reset stats · t colour-blind theme · ctrl+p commands (type a knob
value) · ? help (knob guidance: a digit shows a claim live) · q quit
"""


class OneLineParser(argparse.ArgumentParser):
    """Bad flags: one line on stderr (not argparse's usage block) and exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def check_model(name: str | None) -> str | None:
    """Why `name` cannot be a model (None if it may be one), without loading anything:
    the engine's own rules (engine/worker/models/loader.py), checked before the slow start."""
    from engine.worker.models.presets import PRESETS
    if name is None or name == "default":
        return None
    if name.startswith("dummy:"):
        preset = name.removeprefix("dummy:")
        return None if preset in PRESETS else (
            f"unknown dummy preset {preset!r}; presets: {', '.join(sorted(PRESETS))}")
    if os.path.isdir(name):
        return None if os.path.exists(os.path.join(name, "config.json")) else (
            f"{name} has no config.json: not an HF checkpoint directory")
    if os.path.exists(name):
        return f"model path {name!r} is not a directory"
    if name.count("/") != 1 or name.startswith(("/", ".")):
        return (f"unknown model {name!r}: not a directory, a hub id (org/name), 'default' or "
                f"dummy:<preset>")
    return None


def check_record_path(path: str | None) -> str | None:
    """Why the app could not write a recording to `path` (None if it can)."""
    if path is None:
        return None
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return f"--record {path}: is a directory"
    if not os.path.isdir(folder):
        return f"--record {path}: folder {folder} does not exist"
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        return f"--record {path}: not writable"
    return None


def check_engine(args) -> str | None:
    """Why the engine could not serve this workload, before the app opens (None if it
    can): the knobs as the engine checks them, a KV pool too small for the scenario's
    longest request (the engine would refuse it, forever), and --device cuda without
    CUDA."""
    from engine.config import InvalidRequestError, make_config
    from roseplay.workload.fit import pool_problem
    kwargs = engine_kwargs(args)
    kwargs.setdefault("num_blocks", TUI_NUM_BLOCKS)
    kwargs.setdefault("max_num_seqs", TUI_MAX_NUM_SEQS)
    try:
        config = make_config(**kwargs)
    except InvalidRequestError as exc:
        return str(exc)
    # token-id prompts: exact for a model without a tokenizer, an estimate for text; a
    # pool too small is measured again with the model's tokenizer where it is on disk
    # (the number recommended then serves), and the loaded engine checks the text
    # prompts exactly (roseplay/workload/source.py start_live)
    sizes = dict(input_len=args.input_len, output_len=args.output_len)
    problem = pool_problem(args.scenario, config.num_blocks, config.block_size, **sizes)
    if problem:
        tokenizer = local_tokenizer(args.model)
        if tokenizer is not None:
            problem = pool_problem(args.scenario, config.num_blocks, config.block_size,
                                   tokenizer=tokenizer, **sizes)
    if problem:
        return problem
    if config.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            return "--device cuda: no CUDA device is visible here; use --device cpu (or auto)"
    return None


def check_bench_config(args) -> str | None:
    """Why the bench's own engine could not start with these flags (None if it can, or
    when the bench drives a server, --base-url): a bad flag is exit status 2, as in
    `roseplay` and `roseplay serve`, not a failed run."""
    from engine.config import InvalidRequestError, make_config
    if getattr(args, "base_url", None) or not hasattr(args, "device"):
        return None
    try:
        make_config(**engine_kwargs(args))
    except InvalidRequestError as exc:
        return str(exc)
    return None


def local_tokenizer(name: str | None):
    """The tokenizer of the bundled model or a checkpoint directory (None otherwise: a
    hub id is not fetched for a check)."""
    from engine.tokenizer import load_tokenizer
    if name in (None, "default") or (os.path.isdir(name) and not name.startswith("dummy:")):
        return load_tokenizer(name or "default")
    return None


def check_compare(args) -> str | None:
    """Parse --compare in place (KNOB, [A, B]); why it cannot run, or None."""
    from roseplay.tui.compare import parse_compare
    if args.connect or args.replay:
        return "--compare starts its own two engines: not with --connect or --replay"
    try:
        args.compare = parse_compare(args.compare)
    except ValueError as exc:
        return str(exc)
    return None


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="roseplay", description=DESCRIPTION, epilog=EPILOG,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_flags(p.add_argument_group("workload (all live in the app)"), "roseplay")
    s = p.add_argument_group("session")
    s.add_argument("--record", metavar="PATH",
                   help="Write the session (snapshots at ~10 Hz, knob changes, timings) to "
                        "PATH (gzipped JSON lines).")
    s.add_argument("--replay", metavar="PATH",
                   help="Play a recorded session back (no model is loaded); space pauses, "
                        "n / b step forward / back one frame.")
    s.add_argument("--replay-speed", type=number(float, 0, strict=True), default=1.0,
                   help="Replay speed (default: 1).")
    s.add_argument("--paused", action="store_true",
                   help="Start paused (press n to step, space to run).")
    s.add_argument("--connect", metavar="ADDRESS",
                   help="Watch (and steer) an engine that another process runs: `roseplay "
                        "bench --engine-address ADDRESS` or `roseplay serve` print theirs. "
                        "The app adds no load of its own until you pick a scenario (s); "
                        "quitting leaves that engine serving.")
    add_engine_key_flag(s)
    s.add_argument("--compare", metavar="KNOB=A,B",
                   help="Two engines side by side on one workload stream (the same prompts, "
                        "order and arrivals): side A with KNOB=A, side B with KNOB=B, any knob "
                        "below (e.g. enable_prefix_caching=true,false, "
                        "max_num_batched_tokens=256,2048); the ratio B/A of every metric. "
                        "Other knobs and keys apply to both sides.")
    add_goodput_flag(s)
    s.add_argument("--in-process", action="store_true",
                   help="Run the engine on a thread of the app's process (the old way: the "
                        "UI then shares the engine's GIL and slows it down).")
    add_engine_flags(p)
    for action in p._actions:
        if action.dest == "num_blocks":
            action.help += f" The app defaults to {TUI_NUM_BLOCKS} so that the map stays readable."
        if action.dest == "max_num_seqs":
            action.help += (f" The app defaults to {TUI_MAX_NUM_SEQS}, fewer than the requests in "
                            "flight: a queue forms and the scheduling policy shows.")
    return p


def _bench(argv: list[str]) -> int:
    from engine.config import InvalidRequestError
    from roseplay.bench import inproc as bench  # lazy: the TUI does not need it
    parser = OneLineParser(prog="roseplay")
    bench.add_parser(parser.add_subparsers(dest="command", required=True,
                                           parser_class=OneLineParser))
    args = parser.parse_args(argv)
    problem = check_model(getattr(args, "model", None)) or check_bench_config(args)
    if problem:
        return _fail(problem)
    try:
        return args.func(args) or 0
    except (InvalidRequestError, OSError) as exc:
        return _fail(str(exc), 1)


def _fail(message: str, code: int = 2) -> int:
    first = message.strip().splitlines()[0] if message.strip() else "error"
    print(f"roseplay: error: {first}", file=sys.stderr)
    return code


def make_source_factory(args):
    from roseplay.workload.source import start_live
    kwargs = engine_kwargs(args)
    kwargs.setdefault("num_blocks", TUI_NUM_BLOCKS)
    kwargs.setdefault("max_num_seqs", TUI_MAX_NUM_SEQS)

    def factory():
        return start_live(kwargs, scenario=args.scenario, concurrency=args.concurrency,
                          rate=args.rate, input_len=args.input_len, output_len=args.output_len,
                          temperature=args.temperature, seed=kwargs.get("seed", 0) or 0,
                          record=args.record, paused=args.paused, connect=args.connect,
                          in_process=args.in_process)
    if args.connect:
        return factory, f"connecting to {args.connect} …"
    return factory, f"loading {kwargs.get('model', 'the default model')} …"


def make_compare_factory(args):
    from roseplay.tui.compare import start_compare
    knob, values = args.compare
    kwargs = engine_kwargs(args)
    kwargs.setdefault("num_blocks", TUI_NUM_BLOCKS)
    kwargs.setdefault("max_num_seqs", TUI_MAX_NUM_SEQS)

    def factory():
        return start_compare(kwargs, knob, values, scenario=args.scenario,
                             concurrency=args.concurrency, rate=args.rate,
                             input_len=args.input_len, output_len=args.output_len,
                             temperature=args.temperature, seed=kwargs.get("seed", 0) or 0,
                             record=args.record, paused=args.paused, in_process=args.in_process)
    return factory, f"loading two engines: {knob}={values[0]} and {values[1]} …"


def replay_app(args, slos: dict):
    """The app for a recording: side by side if it is one side of a compare session."""
    from roseplay.tui.compare import CompareReplaySource, is_compare_recording
    from roseplay.workload.source import ReplaySource
    if is_compare_recording(args.replay):
        from roseplay.tui.compare_app import CompareApp
        return CompareApp(source=CompareReplaySource(args.replay, speed=args.replay_speed,
                                                     start_paused=args.paused), slos=slos)
    from roseplay.tui.app import RoseplayApp
    return RoseplayApp(source=ReplaySource(args.replay, speed=args.replay_speed,
                                           start_paused=args.paused), slos=slos)


def run_tui(args) -> int:
    slos = goodput_slos(args)
    early = None
    if not args.replay:             # the engine starts loading before Textual is imported
        factory, message = (make_compare_factory if args.compare else make_source_factory)(args)
        early = EarlyStart(factory)
        if sys.stdout.isatty():     # importing Textual takes a second or two: say why
            print(f"roseplay: {message}", flush=True)
    from roseplay.tui.app import RoseplayApp
    if args.replay:
        try:
            app = replay_app(args, slos)
        except (OSError, ValueError) as exc:
            return _fail(f"cannot replay {args.replay}: {exc}")
    elif args.compare:
        from roseplay.tui.compare_app import CompareApp
        app = CompareApp(source_factory=early, loading_message=message, slos=slos)
    else:
        app = RoseplayApp(source_factory=early, loading_message=message, slos=slos)
    try:
        app.run()
    finally:
        if early is not None:
            early.release()
    if app.load_error:
        return _fail(f"could not start: {app.load_error}", 1)
    return app.return_code or 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        return _bench(argv)
    if argv and argv[0] == "serve":
        from roseplay.serve.cli import main as serve_main   # lazy: the TUI does not need it
        return serve_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.engine_key:          # read by every EngineClient of this process
        from engine.ipc.auth import ENGINE_KEY_ENV
        os.environ[ENGINE_KEY_ENV] = args.engine_key
    problem = None if args.replay or args.connect else (
        check_model(args.model) or check_record_path(args.record) or check_engine(args))
    if args.compare and not problem:
        problem = check_compare(args)
    if problem:
        return _fail(problem)
    return run_tui(args)


if __name__ == "__main__":
    sys.exit(main())
