"""The `roseplay` command: no subcommand opens the TUI (roseplay/tui/launch.py); `roseplay
bench ...` benchmarks (roseplay/bench/), `roseplay serve ...` serves (roseplay/serve/).

Engine flags come from engine/config.py through roseplay.cli_flags (each knob defined
once). The bench subcommand is imported only when asked for, and `--replay` never loads
a model (nor torch).
"""
from __future__ import annotations

import argparse
import os
import sys

from roseplay.cli_checks import (check_bench_config, check_compare, check_engine,
                                 check_engine_access, check_model, check_output_path,
                                 check_session)
from roseplay.cli_flags import (OneLineParser, add_engine_flags, add_engine_key_flag,
                                add_goodput_flag, usage_error)
from roseplay.tui.defaults import note_app_defaults
from roseplay.tui.launch import CannotStart, run_tui
from roseplay.workload.flags import add_workload_flags, number

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
e eviction policy · h preemption mode · d/D draft tokens (speculative decoding) ·
u/U routing policy (data parallel) · s/S scenario · </> concurrency · r/R rate ·
x clear prefix cache · i type a prompt · o/f sort/filter requests · z zoom a panel ·
l goodput SLOs · 0 reset stats · t colour-blind theme · ctrl+p commands (type a knob
value) · ? help (knob guidance: a digit shows a claim live) · q quit
"""


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
    s.add_argument("--connect", metavar="ADDRESS", action="append",
                   help="Watch (and steer) an engine that another process runs: `roseplay "
                        "bench --engine-address ADDRESS` or `roseplay serve` print theirs. "
                        "The app adds no load of its own until you pick a scenario (s); "
                        "quitting leaves that engine serving. Two or more times: a "
                        "data-parallel front over those engines (`roseplay serve "
                        "--headless`, KV events on; --routing-policy applies), as with "
                        "--data-parallel-size (docs/ROUTING.md).")
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
    note_app_defaults(p)
    return p


def _bench(argv: list[str]) -> int:
    from engine.config import InvalidRequestError
    from roseplay.bench import inproc as bench  # lazy: the TUI does not need it
    parser = OneLineParser(prog="roseplay")
    sub = bench.add_parser(parser.add_subparsers(dest="command", required=True,
                                                 parser_class=OneLineParser))
    args, extra = parser.parse_known_args(argv)
    if extra:          # the bench's error, not the app's (argparse hands them up)
        sub.error(f"unrecognized arguments: {' '.join(extra)}")
    problem = (check_model(getattr(args, "model", None))
               or check_output_path("--json", getattr(args, "json", None))
               or check_engine_access(getattr(args, "engine_address", None),
                                      getattr(args, "engine_key", None))
               or _combination_problem(args) or check_bench_config(args))
    if problem:
        return _fail(problem, prog="roseplay bench", usage=True)
    try:
        return args.func(args) or 0
    except (InvalidRequestError, OSError) as exc:
        return _fail(str(exc), 1, prog="roseplay bench")


def _combination_problem(args) -> str | None:
    """The bench's flag combinations (bench/args.py check_args; run() checks them again,
    for `python -m roseplay.bench.inproc`), before its engine's checks: --host / --port
    name a server whose engine is not this one's."""
    from roseplay.bench.args import check_args
    try:
        check_args(args)
    except ValueError as exc:
        return str(exc)
    return None


def _fail(message: str, code: int = 2, prog: str = "roseplay", usage: bool = False) -> int:
    """One line on stderr, prefixed as argparse's errors of the same command; `usage`: a
    bad flag, which ends as argparse's own (see PROG --help)."""
    if usage:
        print(usage_error(prog, message), file=sys.stderr)
        return code
    first = message.strip().splitlines()[0] if message.strip() else "error"
    print(f"{prog}: error: {first}", file=sys.stderr)
    return code


def _app_problem(args) -> str | None:
    """Why the app cannot start with these flags (None if it can), before it opens."""
    if args.replay or args.connect:
        return check_session(args) or (check_engine_access(args.connect, args.engine_key)
                                       if args.connect else None)
    return (check_model(args.model) or check_output_path("--record", args.record)
            or check_engine(args))


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
    problem = _app_problem(args)
    if args.compare and not problem:
        problem = check_compare(args)
    if problem:
        return _fail(problem, usage=True)
    try:
        return run_tui(args)
    except CannotStart as exc:
        return _fail(str(exc), exc.code)


if __name__ == "__main__":
    sys.exit(main())
