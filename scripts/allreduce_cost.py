"""What does tensor parallelism's communication cost per decode step? Two ranks, the
all-reduces one decode step of a model does (2 per layer, [batch, hidden]), captured in
one CUDA graph as the engine's decode graphs capture them; median of 50 replays.

    python scripts/allreduce_cost.py --hidden 4096 --layers 32 --batch 1,64,256
    python scripts/allreduce_cost.py --device cpu --layers 2     # dry run (gloo, eager)

Hard timeout (--timeout-s): every rank prints its stacks and the run exits instead of
hanging. The graph is reset before the process group is destroyed: NCCL's teardown waits
for every graph that captured one of its collectives (pytorch#115388; that wait is what
hung this script at its timeout on 2x H200).
"""
import argparse
import faulthandler
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from devtools.tp_timeout import exit_with_stacks_after  # noqa: E402
from engine.worker.distributed.group import (bind_device, destroy_group, free_port,  # noqa: E402
                                             init_group)
from engine.worker.models.parallel import TPInfo  # noqa: E402

REPLAYS = 50


def time_one(x, args, use_graph: bool) -> list[float]:
    """Milliseconds of 2 * layers all-reduces of x, REPLAYS times (ranks aligned first)."""
    step = lambda: [dist.all_reduce(x) for _ in range(2 * args.layers)]   # noqa: E731
    graph = None
    if use_graph:
        for _ in range(3):
            dist.all_reduce(x)              # warm up (communicator, buffers) outside capture
        torch.cuda.synchronize()
        graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            dist.all_reduce(x)
            with torch.cuda.graph(graph, stream=stream):
                step()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
    times = []
    for _ in range(REPLAYS):
        dist.barrier()
        if use_graph:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            graph.replay()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e3)
    if graph is not None:
        graph.reset()                       # before the group goes (see the docstring)
    return times


def rank_main(rank: int, world: int, port: int, args, out) -> None:
    faulthandler.register(__import__("signal").SIGUSR1, all_threads=True)
    cuda = args.device == "cuda"
    bind_device(args.device, rank, world)
    init_group(TPInfo(rank, world), port, args.device, timeout_s=args.timeout_s)
    dtype = torch.bfloat16 if cuda else torch.float32
    rows = []
    for bs in [int(b) for b in args.batch.split(",")]:
        x = torch.randn(bs, args.hidden, dtype=dtype, device=args.device) * 1e-3
        times = time_one(x, args, use_graph=cuda)
        rows.append((bs, statistics.median(times), min(times), max(times)))
    if rank == 0:
        out.put(rows)
    destroy_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--batch", default="1,64,256")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--timeout-s", type=float, default=90.0)
    args = p.parse_args()
    cancel = exit_with_stacks_after(args.timeout_s)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, 2, port, args, out), daemon=True)
             for r in range(2)]
    for pr in procs:
        pr.start()
    rows = out.get(timeout=args.timeout_s)
    for pr in procs:
        pr.join(10)
        if pr.is_alive():
            print(f"rank pid {pr.pid} still alive after its results: killed", file=sys.stderr)
            pr.kill()
    cancel()
    what = "one CUDA graph" if args.device == "cuda" else "eager, gloo"
    for bs, med, lo, hi in rows:
        print(f"allreduce batch={bs} hidden={args.hidden} count={2 * args.layers} "
              f"median_ms={med:.3f} min_ms={lo:.3f} max_ms={hi:.3f} ({what}, 2 ranks, "
              f"{REPLAYS} replays)")


if __name__ == "__main__":
    main()
