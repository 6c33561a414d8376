"""The app's own engine and workload defaults (the `roseplay` command's, which the guides
are tuned for and the tests measure)."""
from roseplay.workload.flags import WORKLOAD_DEFAULTS

TUI_NUM_BLOCKS = 512        # a pool small enough to read on the map (override with --num-blocks)
TUI_MAX_NUM_SEQS = 16       # fewer running than in flight: a queue, so the scheduling policy
#                             and priorities show (override with --max-num-seqs)
TUI_SCENARIO = WORKLOAD_DEFAULTS["roseplay"].scenario
TUI_CONCURRENCY = WORKLOAD_DEFAULTS["roseplay"].concurrency
