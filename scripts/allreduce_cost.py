"""What does tensor parallelism's communication cost per decode step? Two ranks (NCCL),
the all-reduces one decode step of a model does (2 per layer, [batch, hidden] bf16),
captured in a CUDA graph as the engine's decode graphs capture them; median of 50 replays.

    python scripts/allreduce_cost.py --hidden 4096 --layers 32 --batch 1,64,256
"""
import argparse
import os
import statistics

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank: int, world: int, port: int, args, out) -> None:
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, device_id=torch.device("cuda", rank))
    rows = []
    for bs in [int(b) for b in args.batch.split(",")]:
        x = torch.randn(bs, args.hidden, dtype=torch.bfloat16, device="cuda")
        for _ in range(3):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            dist.all_reduce(x)
            with torch.cuda.graph(g, stream=s):
                for _ in range(2 * args.layers):
                    dist.all_reduce(x)
        torch.cuda.current_stream().wait_stream(s)
        times = []
        for _ in range(50):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            dist.barrier()
            a.record()
            g.replay()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        rows.append((bs, statistics.median(times), min(times), max(times)))
    if rank == 0:
        out.put(rows)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--batch", default="1,64,256")
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = 29511
    procs = [ctx.Process(target=rank_main, args=(r, 2, port, args, out)) for r in range(2)]
    for pr in procs:
        pr.start()
    rows = out.get(timeout=300)
    for pr in procs:
        pr.join(60)
    for bs, med, lo, hi in rows:
        print(f"all-reduces of one decode step ({2 * args.layers} x [{bs}, {args.hidden}] bf16, "
              f"2 ranks, one graph): median {med:.3f} ms ({lo:.3f}..{hi:.3f}) over 50 replays")


if __name__ == "__main__":
    main()
