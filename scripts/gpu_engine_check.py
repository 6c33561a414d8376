"""Quick engine timing on the GPU machine: W1 throughput/TTFT and batch-1 latency.

python scripts/gpu_engine_check.py --model dummy:qwen2.5-0.5b
(The full benchmark with HF side by side is `roseplay bench`.)
"""
import argparse
import time

import torch

from engine import LLM, SamplingParams
from engine.metrics import summarize_requests


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="dummy:qwen2.5-0.5b")
    ap.add_argument("--num-prompts", type=int, default=256)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--enforce-eager", action="store_true")
    a = ap.parse_args()
    llm = LLM(model=a.model, max_num_batched_tokens=a.max_num_batched_tokens,
              max_num_seqs=max(256, a.num_prompts), enforce_eager=a.enforce_eager,
              max_model_len=2048)
    eng = llm.engine
    print("blocks", eng.pool.num_blocks, "backend", eng.backend, "graphs", eng.runner.graphs is not None)
    g = torch.Generator().manual_seed(0)
    vocab = eng.vocab_size
    prompts = [{"prompt_token_ids": torch.randint(100, min(vocab, 50000), (a.input_len,), generator=g).tolist()}
               for _ in range(a.num_prompts)]
    sp = SamplingParams(max_tokens=a.output_len, temperature=0, ignore_eos=True)
    llm.generate(prompts[:8], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    eng.clear_prefix_cache()
    torch.cuda.synchronize(); t = time.perf_counter()
    outs = llm.generate(prompts, sp)
    torch.cuda.synchronize(); dt = time.perf_counter() - t
    n = sum(len(o.outputs[0].token_ids) for o in outs)
    s = summarize_requests(o.metrics for o in outs)
    print(f"W1: {dt:.2f}s {n} tokens {n/dt:.0f} out tok/s TTFT p50 {s['ttft'].p50*1e3:.0f} ms "
          f"p99 {s['ttft'].p99*1e3:.0f} ms TPOT p50 {s['tpot'].p50*1e3:.2f} ms steps {eng.stats.counters.steps}")
    eng.clear_prefix_cache()
    one = prompts[0]
    llm.generate([one], sp)
    eng.clear_prefix_cache()
    torch.cuda.synchronize(); t = time.perf_counter()
    o = llm.generate([one], sp)[0]
    dt = time.perf_counter() - t
    print(f"batch 1: {dt/a.output_len*1e3:.2f} ms/token total; TPOT {o.metrics.tpot*1e3:.3f} ms")


if __name__ == "__main__":
    main()
