"""Where the GPU waits during a whole workload: W1 (256 x 512 random prompt tokens -> 128,
EOS ignored, all at once; budget 8192, 256 sequences) through LLM.generate under the
torch profiler (CUDA activity only, so the host is not slowed by CPU tracing), after a
warm-up of 16 requests. The GPU's event stream is cut in two phases: the mixed phase (up
to the last unified-attention launch: every step that carries prefill tokens) and the
decode phase after it. Per phase: its span, the GPU's busy time (the union of kernel
and copy intervals), its idle time, the idle gaps by size, and the kernels that move the
stream's end the most (with PDL kernels overlap, so summed durations double count),
the idle time in each tenth of the phase, the largest gaps, and the process's
garbage-collection pauses during the run (gc.callbacks).

PYTHONPATH=. python3 scripts/gpu_idle.py [--model dummy:qwen3-0.6b --kv-cache-dtype fp8]
"""
import argparse
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gc_pauses import gc_pauses  # noqa: E402
from step_timeline import gpu_events  # noqa: E402

sys.path.insert(0, os.getcwd())
from engine import LLM, SamplingParams  # noqa: E402

GAP_BINS = (5, 20, 100, 1000, float("inf"))     # us: idle gaps counted by size


def prompts(n: int, length: int, seed: int) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    return [{"prompt_token_ids": torch.randint(100, 50000, (length,), generator=g).tolist()}
            for _ in range(n)]


def phase(events: list) -> dict:
    """Span, busy, idle and gaps of a run of (ts, dur, name, cat) events, in us."""
    t0 = events[0][0]
    busy, gaps, end, per, tenths, large = 0.0, [0] * len(GAP_BINS), t0, {}, [0.0] * 10, []
    span = max(ts + dur for ts, dur, _, _ in events) - t0
    for ts, dur, name, _ in events:
        gap = ts - end
        if gap > 0:
            gaps[next(i for i, b in enumerate(GAP_BINS) if gap <= b)] += gap
            tenths[min(9, int(10 * (end - t0) / span))] += gap
            large.append((gap, end - t0))
        grow = max(0.0, ts + dur - max(ts, end))
        busy += grow
        row = per.setdefault(name.split(" grid")[0][:70], [0, 0.0])
        row[0] += 1
        row[1] += grow
        end = max(end, ts + dur)
    return {"span": end - t0, "busy": busy, "gaps": gaps, "per": per, "tenths": tenths,
            "large": sorted(large, reverse=True)[:8]}


def report(label: str, p: dict, top: int) -> None:
    span, busy = p["span"], p["busy"]
    print(f"{label}: span {span / 1e3:8.2f} ms, GPU busy {busy / 1e3:8.2f} ms, "
          f"idle {(span - busy) / 1e3:7.2f} ms ({100 * (span - busy) / max(span, 1):.1f} %)")
    lo = 0
    for b, us in zip(GAP_BINS, p["gaps"]):
        print(f"    gaps {lo:>5}..{b:<5} us: {us / 1e3:7.2f} ms")
        lo = b
    print("    idle per tenth of the phase (ms): "
          + " ".join(f"{us / 1e3:.2f}" for us in p["tenths"]))
    print("    largest gaps (us at ms): "
          + ", ".join(f"{gap:.0f} at {at / 1e3:.1f}" for gap, at in p["large"]))
    for name, (calls, us) in sorted(p["per"].items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"    {calls:6d} {us / 1e3:8.2f} ms  {name}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="dummy:qwen2.5-0.5b")
    ap.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "fp8"))
    ap.add_argument("--num-prompts", type=int, default=256)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--top", type=int, default=12, help="kernels listed per phase")
    a = ap.parse_args()
    llm = LLM(model=a.model, max_num_batched_tokens=8192, max_num_seqs=256,
              kv_cache_dtype=a.kv_cache_dtype)
    params = SamplingParams(max_tokens=a.output_len, temperature=0, ignore_eos=True)
    llm.generate(prompts(16, a.input_len, 1), params)
    llm.engine.clear_prefix_cache()
    work = prompts(a.num_prompts, a.input_len, 2)
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof, gc_pauses() as pauses:
        steps = []
        t0 = time.perf_counter()
        llm.generate(work, params, on_step=lambda eng: steps.append(
            (time.perf_counter(), len(eng.requests), eng.stats.counters.finished)))
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    events = gpu_events(path)
    os.remove(path)
    os.rmdir(os.path.dirname(path))
    last_mixed = max(i for i, e in enumerate(events) if "unified" in e[2])
    print(f"{a.model} W1-shaped ({a.num_prompts} x {a.input_len} -> {a.output_len}), "
          f"kv {a.kv_cache_dtype}: wall {wall * 1e3:.1f} ms, "
          f"{a.num_prompts * a.output_len / wall:,.0f} output tok/s under the profiler")
    for gen in range(3):
        took = [s for g, s in pauses if g == gen]
        print(f"gc generation {gen}: {len(took)} collections, {sum(took) * 1e3:.2f} ms, "
              f"longest {max(took, default=0) * 1e3:.2f} ms")
    slow = sorted(((b[0] - a[0], i, b) for i, (a, b) in enumerate(zip(steps, steps[1:]))),
                  reverse=True)[:6]
    print(f"host: {len(steps)} steps; the longest (ms, step, at ms, requests, finished): "
          + ", ".join(f"{d * 1e3:.1f} #{i + 1} {(s[0] - t0) * 1e3:.0f} {s[1]} {s[2]}"
                      for d, i, s in slow))
    report("mixed phase", phase(events[:last_mixed + 1]), a.top)
    report("decode phase", phase(events[last_mixed + 1:]), a.top)


if __name__ == "__main__":
    main()
