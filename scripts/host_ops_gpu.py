"""The host's side of a batch-1 decode step on the GPU, in one process: how long each
CUDA-facing call takes the host (graph replay, the input kernel's launch, a small
kernel copy, an event record, the token's host copy), the step's host time (not
waiting on the device) and a cProfile of the steps by own time.

    python scripts/host_ops_gpu.py [--model dummy:qwen2.5-0.5b] [--steps 500]

At batch 1 the GPU step is ~0.69 ms: whatever the host needs beyond that is TPOT.
"""
import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from engine import LLM  # noqa: E402
from profile_step import fill, time_replay  # noqa: E402


def per_call_us(fn, calls: int = 400, sync_every: int = 20) -> str:
    """Median (min..p90) host µs of fn(), the device synced every sync_every calls so
    the launch queue stays short, as it is while serving."""
    times = []
    for i in range(calls):
        if i % sync_every == 0:
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e6)
    torch.cuda.synchronize()
    times.sort()
    return f"{statistics.median(times):7.1f} us ({times[0]:.1f}..{times[int(0.9 * len(times))]:.1f})"


def host_per_step(llm, steps: int) -> None:
    eng = llm.engine
    for _ in range(20):
        eng.step()
    torch.cuda.synchronize()
    w0, t0 = eng.counters.device_wait_us, time.perf_counter()
    for _ in range(steps):
        eng.step()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / steps * 1e3
    wait = (eng.counters.device_wait_us - w0) / steps / 1e3
    print(f"step {wall:.3f} ms, host (not waiting) {wall - wait:.3f} ms, wait {wait:.3f} ms")


def ops(llm) -> None:
    from kernels.step_inputs import copy_decode_inputs
    runner = llm.engine.executor.runner
    graphs = runner.graphs
    graph, out = graphs.graphs[("decode", 1)]
    print("graph.replay()        ", per_call_us(graph.replay))
    _, _, _, copies = graphs.buffers._views(1)
    (tok, _, tok_a), (lens, _, lens_a), (table, _, table_a) = copies
    print("copy_decode_inputs    ", per_call_us(
        lambda: copy_decode_inputs(tok_a, lens_a, table_a, tok, lens, table, None)))
    print("copy_decode_inputs fed", per_call_us(
        lambda: copy_decode_inputs(tok_a, lens_a, table_a, tok, lens, table, tok[:1])))
    small = torch.zeros(4, device="cuda")
    print("torch.add (copy)      ", per_call_us(lambda: torch.add(small, 0, out=small)))
    ev = torch.cuda.Event()
    print("event.record()        ", per_call_us(ev.record))
    ring, tokens = llm.engine.executor._host_copies, out[1][:1]
    print("HostCopyRing.start    ", per_call_us(lambda: ring.start(tokens).tolist()))
    print("tensor slice [:1]     ", per_call_us(lambda: out[0][:1]))


def pipelined(parts, steps: int = 400) -> str:
    """The engine's pattern without the engine: launch iteration i's parts, record an
    event, wait for iteration i-1's. Median host µs of each part, of the wait, and the
    loop's period."""
    events = [torch.cuda.Event() for _ in range(2)]
    times = {name: [] for name, _ in parts + [("wait", None)]}
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        for name, fn in parts:
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
        events[i % 2].record()
        if i:
            t = time.perf_counter()
            events[(i - 1) % 2].synchronize()
            times["wait"].append(time.perf_counter() - t)
    torch.cuda.synchronize()
    period = (time.perf_counter() - t0) / steps * 1e3
    each = " ".join(f"{k} {statistics.median(v) * 1e6:.1f}" for k, v in times.items())
    return f"period {period:.3f} ms; host us: {each}"


def sequences(llm) -> None:
    """Which launch makes another slow: the step's launches in the engine's order."""
    from kernels.step_inputs import copy_decode_inputs
    from engine.worker.device_io import device_alias
    graphs = llm.engine.executor.runner.graphs
    graph, out = graphs.graphs[("decode", 1)]
    _, _, _, copies = graphs.buffers._views(1)
    (tok, _, tok_a), (lens, _, lens_a), (table, _, table_a) = copies
    host = torch.zeros(256, dtype=torch.int64, pin_memory=True)
    alias, tokens = device_alias(host, tok.device)[:1], out[1][:1]
    inputs = ("inputs", lambda: copy_decode_inputs(tok_a, lens_a, table_a, tok, lens, table, tokens))
    replay = ("replay", graph.replay)
    add = ("add", lambda: torch.add(tokens, 0, out=alias))
    memcpy = ("memcpy", lambda: host[:1].copy_(tokens, non_blocking=True))
    for _ in range(2):
        print(f"back-to-back replays   {time_replay(llm, 1) * 1e3:.3f} ms each")
    for name, parts in (("replay", [replay]), ("inputs+replay", [inputs, replay]),
                        ("replay+add", [replay, add]), ("inputs+replay+add", [inputs, replay, add]),
                        ("inputs+replay+memcpy", [inputs, replay, memcpy]),
                        ("add+inputs+replay", [add, inputs, replay])):
        for _ in range(2):
            print(f"{name:22}", pipelined(parts))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="dummy:qwen2.5-0.5b")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--max-model-len", type=int, default=8192, help="the engine's default")
    a = ap.parse_args()
    llm = LLM(model=a.model, max_num_batched_tokens=8192, max_num_seqs=256,
              max_model_len=a.max_model_len)
    fill(llm, 1)
    for _ in range(2):
        host_per_step(llm, a.steps)
    ops(llm)
    sequences(llm)
    prof = cProfile.Profile()
    prof.enable()
    host_per_step(llm, a.steps)
    prof.disable()
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(28)
    stats.sort_stats("cumulative").print_stats(40)
    stats.print_callees("__exit__|replay|start")


if __name__ == "__main__":
    main()
