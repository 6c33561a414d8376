"""The app's own engine and workload defaults (the `roseplay` command's, which the guides
are tuned for and the tests measure): here, with the TUI, not in the command line."""
from roseplay.cli_flags import engine_kwargs
from roseplay.workload.flags import WORKLOAD_DEFAULTS

TUI_NUM_BLOCKS = 512        # a pool small enough to read on the map (override with --num-blocks)
TUI_MAX_NUM_SEQS = 16       # fewer running than in flight: a queue, so the scheduling policy
#                             and priorities show (override with --max-num-seqs)
TUI_SCENARIO = WORKLOAD_DEFAULTS["roseplay"].scenario
TUI_CONCURRENCY = WORKLOAD_DEFAULTS["roseplay"].concurrency

ENGINE_DEFAULTS = {"num_blocks": TUI_NUM_BLOCKS, "max_num_seqs": TUI_MAX_NUM_SEQS}
HELP_NOTES = {   # appended to the engine flag's help in `roseplay --help`
    "num_blocks": f" The app defaults to {TUI_NUM_BLOCKS} so that the map stays readable.",
    "max_num_seqs": (f" The app defaults to {TUI_MAX_NUM_SEQS}, fewer than the requests in "
                     "flight: a queue forms and the scheduling policy shows."),
}


def app_engine_kwargs(args) -> dict:
    """The engine's keywords from the flags, the app's defaults where a flag is not given."""
    kwargs = engine_kwargs(args)
    for name, value in ENGINE_DEFAULTS.items():
        kwargs.setdefault(name, value)
    return kwargs


def note_app_defaults(parser) -> None:
    """Say the app's own defaults in the engine flags' help."""
    for action in parser._actions:
        if action.dest in HELP_NOTES:
            action.help += HELP_NOTES[action.dest]
