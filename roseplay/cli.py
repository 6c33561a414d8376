"""The `roseplay` command: no subcommand opens the TUI; `roseplay bench ...` benchmarks.

Engine flags come from engine/config.py through roseplay.cli_flags (each knob defined
once). The bench subcommand is imported only when asked for, and `--replay` never loads
a model (nor torch).
"""
from __future__ import annotations

import argparse
import sys

from roseplay.cli_flags import add_engine_flags, engine_kwargs
from roseplay.scenarios import SCENARIOS

TUI_NUM_BLOCKS = 512        # a pool small enough to read on the map (override with --num-blocks)
DESCRIPTION = ("An interactive terminal playground on a real in-process LLM inference engine: "
               "paged KV blocks, prefix-cache sharing, chunked prefill and per-token timing, "
               "live, while you turn the knobs.")
EPILOG = """\
commands:
  roseplay bench ...      benchmark the engine (vLLM benchmark_serving style);
                          see `roseplay bench --help`
  roseplay serve ...      an OpenAI-compatible server on the engine;
                          see `roseplay serve --help`

keys in the app: space pause/resume · n one step · c prefix cache · -/+ token budget ·
[/] max running seqs · s scenario · </> concurrency · r rate · x clear prefix cache ·
i type a prompt · ? help · q quit
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="roseplay", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    w = p.add_argument_group("workload (all live in the app)")
    w.add_argument("--scenario", default="shared-prefix", choices=list(SCENARIOS),
                   help="Scenario served at start (default: shared-prefix). " + " ".join(
                       f"{s.name}: {s.description}" for s in SCENARIOS.values()))
    w.add_argument("--concurrency", type=int, default=16,
                   help="Requests kept in flight (closed loop) (default: 16).")
    w.add_argument("--rate", type=float, default=None,
                   help="Poisson arrivals per second, on top of the concurrency cap "
                        "(default: none, send whenever a slot frees).")
    w.add_argument("--input-len", type=int, default=64,
                   help="Prompt tokens for token-id prompts (dummy models) (default: 64).")
    w.add_argument("--output-len", type=int, default=64,
                   help="max_tokens of workload requests (default: 64).")
    w.add_argument("--temperature", type=float, default=0.8,
                   help="Sampling temperature of workload requests (default: 0.8).")
    s = p.add_argument_group("session")
    s.add_argument("--record", metavar="PATH",
                   help="Write the session (snapshots at ~10 Hz, knob changes, timings) to "
                        "PATH (gzipped JSON lines).")
    s.add_argument("--replay", metavar="PATH",
                   help="Play a recorded session back (no model is loaded); space pauses, "
                        "n / b step forward / back one frame.")
    s.add_argument("--replay-speed", type=float, default=1.0, help="Replay speed (default: 1).")
    s.add_argument("--paused", action="store_true",
                   help="Start paused (press n to step, space to run).")
    add_engine_flags(p)
    for action in p._actions:
        if action.dest == "num_blocks":
            action.help += f" The app defaults to {TUI_NUM_BLOCKS} so that the map stays readable."
    return p


def _bench(argv: list[str]) -> int:
    from roseplay import bench     # lazy: the TUI does not need it
    parser = argparse.ArgumentParser(prog="roseplay")
    bench.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args) or 0


def make_source_factory(args):
    from roseplay.source import start_live
    kwargs = engine_kwargs(args)
    kwargs.setdefault("num_blocks", TUI_NUM_BLOCKS)

    def factory():
        return start_live(kwargs, scenario=args.scenario, concurrency=args.concurrency,
                          rate=args.rate, input_len=args.input_len, output_len=args.output_len,
                          temperature=args.temperature, seed=kwargs.get("seed", 0) or 0,
                          record=args.record, paused=args.paused)
    return factory, f"loading {kwargs.get('model', 'the default model')} …"


def run_tui(args) -> int:
    from roseplay.app import RoseplayApp
    if args.replay:
        from roseplay.source import ReplaySource
        try:
            source = ReplaySource(args.replay, speed=args.replay_speed, start_paused=args.paused)
        except (OSError, ValueError) as exc:
            print(f"roseplay: cannot replay {args.replay}: {exc}", file=sys.stderr)
            return 2
        app = RoseplayApp(source=source)
    else:
        factory, message = make_source_factory(args)
        app = RoseplayApp(source_factory=factory, loading_message=message)
    app.run()
    if app.load_error:
        print(f"roseplay: {app.load_error}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        return _bench(argv)
    if argv and argv[0] == "serve":
        from roseplay.serve.cli import main as serve_main   # lazy: the TUI does not need it
        return serve_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.concurrency < 1:
        build_parser().error("--concurrency must be >= 1")
    return run_tui(args)


if __name__ == "__main__":
    sys.exit(main())
