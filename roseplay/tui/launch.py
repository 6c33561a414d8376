"""How `roseplay` (no subcommand) opens the app: the source starts loading before Textual
is imported (roseplay/tui/early_start.py), then the app for a live engine, a compare
pair or a recording runs until it quits."""
from __future__ import annotations

import sys

from roseplay.cli_flags import goodput_slos
from roseplay.tui.defaults import app_engine_kwargs
from roseplay.tui.early_start import EarlyStart


class CannotStart(Exception):
    """The app could not run or its source could not start: a one-line message and the
    command's exit status."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def make_source_factory(args):
    from roseplay.workload.source import start_live
    kwargs = app_engine_kwargs(args)

    def factory():
        return start_live(kwargs, scenario=args.scenario, concurrency=args.concurrency,
                          rate=args.rate, input_len=args.input_len, output_len=args.output_len,
                          temperature=args.temperature, seed=kwargs.get("seed", 0) or 0,
                          record=args.record, paused=args.paused, connect=args.connect,
                          in_process=args.in_process)
    if args.connect:
        return factory, f"connecting to {', '.join(args.connect)} …"
    return factory, f"loading {kwargs.get('model', 'the default model')} …"


def make_compare_factory(args):
    from roseplay.tui.compare import start_compare
    knob, values = args.compare
    kwargs = app_engine_kwargs(args)

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
    """Run the app to its end: its exit status, or CannotStart."""
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
            raise CannotStart(f"cannot replay {args.replay}: {exc}", 2) from None
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
        raise CannotStart(f"could not start: {app.load_error}", 1)
    return app.return_code or 0
