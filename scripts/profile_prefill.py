"""One prefill step of N tokens (N/512 fresh 512-token prompts): wall time and TFLOP/s,
median of --repeat runs with min..max, then the kernels of one step by total GPU time.

TFLOP/s "on weights" is issue 10's measure: 2 x all parameters x tokens (the tied
embedding counted once, as the LM head it also is). "matmul" counts only the GEMMs that
run: the layers' projections for every token and the LM head for the last token of each
prompt (a prefill samples one token per prompt).

PYTHONPATH=. python3 scripts/profile_prefill.py --model dummy:qwen2.5-0.5b --repeat 5

--decode-rows N keeps N requests decoding (512-token prompts) beside each timed prefill,
as W1's first steps mix 8192 prefill tokens with up to 240 decodes.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from engine import LLM, SamplingParams  # noqa: E402
from profile_step import apply_settings, fill  # noqa: E402


def add_prompts(llm, tokens: int, seed: int, input_len: int = 512) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(tokens // input_len):
        llm.add_request({"prompt_token_ids": torch.randint(100, 50000, (input_len,),
                                                           generator=g).tolist()},
                        SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))


def one_prefill(llm, tokens: int, seed: int) -> float:
    add_prompts(llm, tokens, seed)
    eng = llm.engine
    torch.cuda.synchronize()
    t = time.perf_counter()
    eng.step()
    eng.flush()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t
    while eng.has_unfinished() and not any(r.params.max_tokens > 1
                                            for r in eng.scheduler.running):
        eng.step()
    eng.flush()
    return dt


def matmul_flops(model, tokens: int, prompts: int) -> float:
    layers = sum(p.numel() for n, p in model.named_parameters()
                 if p.dim() == 2 and n.startswith("layers."))
    head = model.config.vocab_size * model.config.hidden_size
    return 2 * (layers * tokens + head * prompts)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="dummy:qwen2.5-0.5b")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--decode-rows", type=int, default=0,
                    help="requests decoding beside each prefill (a mixed step)")
    ap.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "fp8"))
    ap.add_argument("--set", action="append", default=[], metavar="MODULE.NAME=INT")
    a = ap.parse_args()
    apply_settings(a.set)
    llm = LLM(model=a.model, max_num_batched_tokens=a.tokens + a.decode_rows,
              max_num_seqs=512, max_model_len=2048, enable_prefix_caching=False,
              kv_cache_dtype=a.kv_cache_dtype)
    model = llm.engine.executor.runner.model
    if a.decode_rows:
        fill(llm, a.decode_rows)
    for seed in range(2):
        one_prefill(llm, a.tokens, 1000 + seed)
    times = [one_prefill(llm, a.tokens, seed) for seed in range(a.repeat)]
    med = statistics.median(times)
    weights = 2 * sum(p.numel() for p in model.parameters()) * a.tokens
    mm = matmul_flops(model, a.tokens, a.tokens // 512)
    print(f"prefill {a.tokens} tokens + {a.decode_rows} decodes: {med * 1e3:.2f} ms "
          f"({min(times) * 1e3:.2f}..{max(times) * 1e3:.2f}) over {a.repeat}; "
          f"{weights / med / 1e12:.0f} TFLOP/s on "
          f"weights ({weights / max(times) / 1e12:.0f}..{weights / min(times) / 1e12:.0f}), "
          f"{mm / med / 1e12:.0f} TFLOP/s of matmuls run")
    if a.no_profile:
        return
    from torch.profiler import ProfilerActivity, profile
    add_prompts(llm, a.tokens, 99)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        llm.engine.step()
        llm.engine.flush()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=24,
                                    max_name_column_width=70))


if __name__ == "__main__":
    main()
