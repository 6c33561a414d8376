"""Device time of a verify step's CUDA graph against a decode step's, replayed with the
inputs of real steps: a verify of 1 + k rows a request (oracle drafts, all wrong, so every
step verifies) and a plain decode, both of `--batch` requests with --input-len prompt
tokens and about 100 generated. CUDA events over 200 replays, five timings each, median
(min..max) µs a replay. scripts/spec_sweep.py's step time holds the host's part too; this
is the verify graph's own device work.

PYTHONPATH=. python3 scripts/verify_replay.py [--model dummy:qwen2.5-0.5b] [--k 3] [--batch 1]
    [--set kernels.linear.ONE_STEP_MAX_M=1]
"""
import argparse
import os
import statistics
import sys

import numpy as np
import torch

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchmarks.oracle import OracleProposer  # noqa: E402
from engine import LLM, SamplingParams  # noqa: E402
from profile_step import add_set_argument, apply_settings, reset, time_graph  # noqa: E402

REFERENCE_TOKENS = 400      # the oracle's references (drafts need them)
STEPS = 100                 # steps of each kind before timing, well within the references


def run_steps(llm: LLM, prompts, kind: str) -> None:
    """Admit the prompts and step until STEPS steps of `kind` replayed, the last one
    included (its inputs stay in the graph buffers)."""
    eng = llm.engine
    params = SamplingParams(max_tokens=REFERENCE_TOKENS, temperature=0, ignore_eos=True)
    for p in prompts:
        llm.add_request({"prompt_token_ids": p}, params)
    replays = eng.executor.runner.graphs.replays
    goal = replays[kind] + STEPS
    while replays[kind] < goal:
        eng.step()
    eng.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="dummy:qwen2.5-0.5b")
    ap.add_argument("--k", type=int, default=3, help="drafts a verify")
    ap.add_argument("--batch", type=int, default=1, help="requests in each step")
    ap.add_argument("--input-len", type=int, default=512)
    add_set_argument(ap)
    a = ap.parse_args()
    apply_settings(a.set)
    if not torch.cuda.is_available():
        sys.exit("verify_replay.py replays CUDA graphs: it needs a CUDA device")
    oracle = OracleProposer(p=0.0)
    with LLM(model=a.model, max_num_seqs=max(16, a.batch), max_num_batched_tokens=8192,
             num_speculative_tokens=a.k, proposer=oracle,
             speculative_config={"method": "ngram"}) as llm:
        eng = llm.engine
        rng = np.random.default_rng(0)
        prompts = [rng.integers(10, eng.vocab_size - 10, a.input_len).tolist()
                   for _ in range(a.batch)]
        eng.set_knobs(eng.knobs.replace(num_speculative_tokens=0))
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                            SamplingParams(max_tokens=REFERENCE_TOKENS, temperature=0,
                                           ignore_eos=True))
        oracle.set_references((p, list(o.outputs[0].token_ids)) for p, o in zip(prompts, outs))
        graphs = eng.executor.runner.graphs
        times = {}
        for kind, k, rows in (("decode", 0, a.batch), ("verify", a.k, a.batch * (1 + a.k))):
            reset(llm)
            eng.set_knobs(eng.knobs.replace(num_speculative_tokens=k))
            run_steps(llm, prompts, kind)
            buckets = graphs.decode_buckets if kind == "decode" else graphs.verify_buckets
            bucket = min(b for b in buckets if b >= rows)
            graph = graphs.graphs[(kind, bucket)][0]
            times[kind] = sorted(1e6 * time_graph(graph, 200, warm=5) for _ in range(5))
            t = times[kind]
            print(f"{kind:6s} graph, {rows} rows (bucket {bucket}): {statistics.median(t):7.1f} "
                  f"µs ({t[0]:.1f}..{t[-1]:.1f})", flush=True)
        ratio = statistics.median(times["verify"]) / statistics.median(times["decode"])
        print(f"verify / decode: x{ratio:.3f}")


if __name__ == "__main__":
    main()
