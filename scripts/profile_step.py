"""Where does a step's time go? GPU replay time vs whole step, per batch size; top kernels.

python scripts/profile_step.py --model dummy:qwen2.5-0.5b
"""
import argparse
import importlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from engine import LLM, SamplingParams  # noqa: E402


def fill(llm, bs, input_len=512):
    eng = llm.engine
    g = torch.Generator().manual_seed(bs)
    for _ in range(bs):
        llm.add_request({"prompt_token_ids": torch.randint(100, 50000, (input_len,), generator=g).tolist()},
                        SamplingParams(max_tokens=10_000, temperature=0, ignore_eos=True))
    while eng.scheduler.waiting or any(r.num_uncomputed > 1 for r in eng.scheduler.running):
        eng.step()


def time_steps(llm, n=30):
    eng = llm.engine
    for _ in range(3):
        eng.step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        eng.step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n


def time_graph(graph, n=50, warm=1) -> float:
    """Seconds a replay of a captured CUDA graph, over n back-to-back replays (CUDA
    events) after `warm` untimed ones."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(warm):
        graph.replay()
    start.record()
    for _ in range(n):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n / 1e3


def time_replay(llm, bs, n=50):
    """time_graph of the decode graph of batch bs's bucket."""
    graphs = llm.engine.executor.runner.graphs
    bucket = min(b for b in graphs.buckets if b >= bs)
    return time_graph(graphs.graphs[("decode", bucket)][0], n)


def reset(llm):
    eng = llm.engine
    eng.flush()          # an overlapped decode step may still be in flight
    for rid in list(eng.requests):
        eng.abort(rid)
    eng.clear_prefix_cache()


def add_set_argument(ap) -> None:
    """--set MODULE.NAME=INT (repeatable), for apply_settings: the A/B flag of this script,
    scripts/verify_replay.py and scripts/spec_sweep.py."""
    ap.add_argument("--set", action="append", default=[], metavar="MODULE.NAME=INT",
                    help="override a module constant before the engine is built, for A/B "
                         "runs, e.g. kernels.linear.SKINNY_MAX_M=16 or "
                         "kernels.decode_attention.TARGET_PROGRAMS_PER_SM=8")


def apply_settings(items):
    for item in items:
        target, value = item.split("=")
        module, name = target.rsplit(".", 1)
        mod = importlib.import_module(module)
        setattr(mod, name, type(getattr(mod, name))(int(value)))


def shipped_values(variants) -> list[str]:
    """MODULE.NAME=VALUE of every knob some variant sets, as the modules ship it: applied
    before each variant, so a knob one variant sets does not carry into the next."""
    names = dict.fromkeys(item.split("=")[0] for v in variants for item in v)
    out = []
    for target in names:
        module, name = target.rsplit(".", 1)
        out.append(f"{target}={getattr(importlib.import_module(module), name)}")
    return out


def ab_variants(a):
    """Decode step and graph replay per batch, for each variant, alternating: one engine
    (decode graphs only, up to the largest batch asked), graphs recaptured per variant,
    each variant on the shipped values of the knobs the others set."""
    batches = [int(b) for b in a.batches.split(",")]
    variants = [v.split(",") if v else [] for v in a.variants.split(";")]
    shipped = shipped_values(variants)
    llm = LLM(model=a.model, max_num_batched_tokens=4096, max_num_seqs=max(batches),
              max_model_len=a.max_model_len, cudagraph_mode="full_decode_only",
              kv_cache_dtype=a.kv_cache_dtype)
    graphs = llm.engine.executor.runner.graphs
    print(f"{'variant':>7} {'round':>5} {'batch':>6} {'step ms':>8} {'replay ms':>9}")
    for r in range(a.rounds):
        for i, settings in enumerate(variants):
            apply_settings(shipped + settings)
            graphs.release()
            graphs.capture()
            for bs in batches:
                fill(llm, bs)
                step = time_steps(llm)
                replay = time_replay(llm, bs)
                print(f"{i:>7} {r:>5} {bs:>6} {step * 1e3:8.3f} {replay * 1e3:9.3f}"
                      f"   {' '.join(settings)}", flush=True)
                reset(llm)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="dummy:qwen2.5-0.5b")
    ap.add_argument("--batches", default="1,16,64,256")
    ap.add_argument("--prefill-tokens", type=int, default=8192)
    ap.add_argument("--profile-batches", default="1,256", help="kernel tables for these batches")
    ap.add_argument("--cprofile-batch", type=int, default=0,
                    help="also cProfile the host side of 30 decode steps at this batch")
    add_set_argument(ap)
    ap.add_argument("--variants", default="",
                    help="A/B in one process: ';'-separated variants, each a ','-separated "
                         "list of MODULE.NAME=INT; the decode graphs are recaptured for each "
                         "and the variants alternate for --rounds rounds (step/replay only)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "fp8"))
    ap.add_argument("--max-model-len", type=int, default=2048,
                    help="(--variants) sizes the block tables, hence the decode graphs' "
                         "attention splits (the engine's default is 8192)")
    a = ap.parse_args()
    apply_settings(a.set)
    if a.variants:
        return ab_variants(a)
    llm = LLM(model=a.model, max_num_batched_tokens=a.prefill_tokens, max_num_seqs=512,
              max_model_len=2048, kv_cache_dtype=a.kv_cache_dtype)
    print(f"{'batch':>6} {'step ms':>8} {'replay ms':>9} {'host ms':>8}")
    for bs in map(int, a.batches.split(",")):
        fill(llm, bs)
        step = time_steps(llm)
        replay = time_replay(llm, bs)
        print(f"{bs:>6} {step*1e3:8.3f} {replay*1e3:9.3f} {(step-replay)*1e3:8.3f}")
        reset(llm)
    # one prefill step of prefill_tokens (512-token prompts)
    eng = llm.engine
    g = torch.Generator().manual_seed(1)
    for _ in range(a.prefill_tokens // 512):
        llm.add_request({"prompt_token_ids": torch.randint(100, 50000, (512,), generator=g).tolist()},
                        SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    torch.cuda.synchronize(); t = time.perf_counter()
    eng.step()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t
    flops = 2 * sum(p.numel() for p in eng.executor.runner.model.parameters()) * a.prefill_tokens
    print(f"prefill step {a.prefill_tokens} tokens: {dt*1e3:.2f} ms ({flops/dt/1e12:.0f} TFLOP/s on weights)")
    reset(llm)
    if a.cprofile_batch:
        import cProfile
        import pstats
        fill(llm, a.cprofile_batch)
        prof = cProfile.Profile()
        prof.enable()
        time_steps(llm)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(22)
        reset(llm)
    # kernel breakdown of eager decode steps (same shapes as the graphs)
    from torch.profiler import ProfilerActivity, profile
    llm.engine.executor.runner.graphs.use_graphs = False
    for bs in [int(b) for b in a.profile_batches.split(",") if b]:
        fill(llm, bs)
        llm.engine.step()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                llm.engine.step()
            torch.cuda.synchronize()
        print(f"--- batch {bs}: 3 eager decode steps ---")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14,
                                        max_name_column_width=48))
        reset(llm)


if __name__ == "__main__":
    main()
