"""What the GPU does between two decode graphs: one engine at a fixed batch, 40 steps
under the torch profiler (CUDA activity), then per step: the GPU busy time, its idle gaps
and the operations outside the graph (copies, sampling), in stream order.

PYTHONPATH=. python3 scripts/step_timeline.py --batch 1 [--trace out.json]
"""
import argparse
import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profile_step import apply_settings, fill, reset  # noqa: E402

sys.path.insert(0, os.getcwd())
from engine import LLM  # noqa: E402


def gpu_events(trace_path):
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    keep = ("kernel", "gpu_memcpy", "gpu_memset")
    out = [(e["ts"], e["dur"], _label(e), e.get("cat", "")) for e in events
           if e.get("cat") in keep and "dur" in e]
    return sorted(out)


def _label(e):
    """Kernel name with its grid: the projections share one kernel name."""
    grid = e.get("args", {}).get("grid")
    return e["name"] + (f" grid{tuple(grid)}" if grid else "")


def per_kernel(events, starts):
    """Per kernel (name + grid) over the whole steps: calls, summed duration, and how far
    its end moves the stream's end forward (with PDL kernels overlap, so durations double
    count; these increments add up to the span)."""
    rows = {}
    prev_end = events[starts[0]][0]
    for ts, dur, name, _ in events[starts[0]:starts[-1]]:
        row = rows.setdefault(name[:90], [0, 0.0, 0.0])
        row[0] += 1
        row[1] += dur
        row[2] += max(0.0, ts + dur - prev_end)
        prev_end = max(prev_end, ts + dur)
    return rows


def summarize(events):
    """Split the event stream into steps at the LM head (the longest kernel, once a step);
    per step: the span from one LM head to the next and the GPU's idle time in it."""
    longest = max(events, key=lambda e: e[1])
    starts = [i for i, e in enumerate(events) if e[2] == longest[2] and e[1] > longest[1] / 2]
    spans, idle = [], []
    for a, b in zip(starts, starts[1:]):
        step = events[a:b]
        t0, t1 = step[0][0], events[b][0]
        busy, end = 0.0, t0
        for ts, dur, _, _ in step:
            busy += max(0.0, ts + dur - max(ts, end))
            end = max(end, ts + dur)
        spans.append(t1 - t0)
        idle.append(t1 - t0 - busy)
    return spans, idle, starts, longest[2]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="dummy:qwen2.5-0.5b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--trace", default="")
    ap.add_argument("--set", action="append", default=[], metavar="MODULE.NAME=INT")
    a = ap.parse_args()
    apply_settings(a.set)
    llm = LLM(model=a.model, max_num_batched_tokens=4096, max_num_seqs=max(a.batch, 1),
              max_model_len=2048, cudagraph_mode="full_decode_only")
    fill(llm, a.batch)
    for _ in range(10):
        llm.engine.step()
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(a.steps):
            llm.engine.step()
        torch.cuda.synchronize()
    path = a.trace or os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    events = gpu_events(path)
    spans, idle, starts, marker = summarize(events)
    med = lambda xs: sorted(xs)[len(xs) // 2]
    print(f"batch {a.batch}: {len(spans)} steps, GPU span per step {med(spans):.1f} us "
          f"(median), idle {med(idle):.1f} us; step marker: {marker[:60]}")
    # one step in order, with the gap before each event
    i0, i1 = starts[len(starts) // 2], starts[len(starts) // 2 + 1]
    prev_end = events[i0 - 1][0] + events[i0 - 1][1]
    for ts, dur, name, cat in events[i0 - 3:i1 + 1]:
        print(f"  gap {ts - prev_end:7.2f}  dur {dur:7.2f}  {cat[:10]:10s} {name[:80]}")
        prev_end = max(prev_end, ts + dur)
    rows, n = per_kernel(events, starts), len(spans)
    print("per step, by operation (calls, us):")
    for name, (c, us, _) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:25]:
        print(f"  {c / n:6.1f} {us / n:9.2f}  {name}")
    print("per step, by kernel and grid, what each adds to the span (calls, us):")
    for name, (c, _, us) in sorted(rows.items(), key=lambda kv: -kv[1][2])[:25]:
        print(f"  {c / n:6.1f} {us / n:9.2f}  {us / c:7.2f}/call  {name}")
    reset(llm)


if __name__ == "__main__":
    main()
