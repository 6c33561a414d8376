"""Regenerate tests/roseplay/tui/data/tui_session.jsonl.gz (the recording behind the TUI replay tests).

    python tests/roseplay/tui/data/make_tui_session.py

A few seconds of dummy:tiny on the CPU: shared-prefix with a small token budget
(chunked prefill), then the prefix cache off, then the identical scenario.
"""
import os
import time

from roseplay.workload.source import start_live

HERE = os.path.dirname(os.path.abspath(__file__))
PATH = os.path.join(HERE, "tui_session.jsonl.gz")


def main() -> None:
    src = start_live(dict(model="dummy:tiny", device="cpu", num_blocks=96, block_size=16,
                          max_num_batched_tokens=64, seed=0),
                     scenario="shared-prefix", concurrency=8, input_len=96, output_len=32,
                     temperature=0.0, record=PATH)
    time.sleep(2.0)
    src.set_knobs(enable_prefix_caching=False)
    time.sleep(1.0)
    src.set_scenario("identical")
    src.set_knobs(enable_prefix_caching=True, max_num_batched_tokens=128)
    time.sleep(1.5)
    src.close()
    print(f"wrote {PATH}: {os.path.getsize(PATH)} bytes, {src.recorder.frames} frames")


if __name__ == "__main__":
    main()
