"""Regenerate tests/roseplay/tui/data/compare_session.jsonl.gz and its side B, compare_session.B.jsonl.gz
(the recordings behind the compare-screen replay and snapshot tests).

    python tests/roseplay/tui/data/make_compare_session.py

Three seconds of `--compare enable_prefix_caching=true,false` on dummy:tiny (CPU, two
in-process engines): shared-prefix, 8 in flight, 64-token budget.
"""
import os
import time

from roseplay.tui.compare import pair_path, start_compare

HERE = os.path.dirname(os.path.abspath(__file__))
PATH = os.path.join(HERE, "compare_session.jsonl.gz")


def main() -> None:
    src = start_compare(dict(model="dummy:tiny", device="cpu", num_blocks=96, block_size=16,
                             max_num_batched_tokens=64, seed=0),
                        "enable_prefix_caching", [True, False], scenario="shared-prefix",
                        concurrency=8, rate=None, input_len=96, output_len=32, temperature=0.0,
                        record=PATH, in_process=True)
    time.sleep(3.0)
    src.close()
    for path in (PATH, pair_path(PATH)):
        print(f"wrote {path}: {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
