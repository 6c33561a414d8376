"""Cost per step of sending a step (the engine's StepBatch) to the other ranks, on the CPU.

    python scripts/bench_broadcast.py [--seqs 64] [--width 128] [--steps 2000]

Rank 0 sends the message of a greedy decode step (a StepBatch of `seqs` tokens with a
[seqs, width] int32 block table); rank 1 receives it, then both join a one-element
all_reduce, as the model's first collective would. Reported per transport (medians):
the latency from rank 0's send to rank 1 holding the unpickled message, and the time
rank 0 spends in send.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import time

import numpy as np
import torch
import torch.distributed as dist

from engine.worker.distributed.broadcast import ShmBroadcast, TorchBroadcast
from engine.worker.distributed.group import destroy_group, free_port, init_group
from engine.worker.models.parallel import TPInfo
from engine.worker.step_batch import SamplingColumns, StepBatch


def message(seqs: int, width: int) -> tuple:
    """What the engine sends for a greedy decode step of `seqs` sequences (no request
    ended since the last step)."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 32000, seqs)
    empty_i32 = np.zeros(0, np.int32)
    sampling = SamplingColumns(tuple(f"req-{i}" for i in range(seqs)), True,
                               np.ones(seqs, bool), np.ones(seqs, np.float32),
                               np.zeros(seqs, np.int64), np.ones(seqs, np.float32),
                               np.zeros(seqs, bool), np.zeros(seqs, np.uint64))
    batch = StepBatch(input_ids=ids, positions=ids.copy(), slot_mapping=ids.copy(),
                      num_decodes=seqs,
                      decode_block_tables=rng.integers(0, 4096, (seqs, width), dtype=np.int32),
                      decode_context_lens=np.full(seqs, width * 16, np.int32),
                      prefill_block_tables=np.zeros((0, 1), np.int32),
                      prefill_cu_seqlens_q=np.zeros(1, np.int32), prefill_context_lens=empty_i32,
                      prefill_max_seqlen_q=0, logits_indices=np.arange(seqs),
                      sample_rows=np.arange(seqs), cow_src=np.zeros(0, np.int64),
                      cow_dst=np.zeros(0, np.int64), sampling=sampling)
    return "step", (batch, ())


def _channel(kind: str, group, rank: int, shm):
    """rank 0 holds the ShmBroadcast it created; rank 1 attaches by name."""
    if kind == "none":
        return None
    if kind == "torch":
        return TorchBroadcast(group, rank)
    if rank == 0:
        return shm
    name, wakeups = shm
    return ShmBroadcast(name, 1, rank, wakeups=wakeups)


def _loop(rank, port, transport, shm, args, results):
    """Rank 1 measures each message's latency (send start -> unpickled), median sent back."""
    group = init_group(TPInfo(rank, 2), port, "cpu", 60)
    one, msg = torch.zeros(1), message(args.seqs, args.width)
    chan = _channel(transport, group, rank, shm)
    latencies, sends = [], []
    dist.barrier()
    for _ in range(args.steps):
        if rank == 0:
            time.sleep(args.interval_ms / 1e3)   # the GPU step the worker waits through
            t0 = time.perf_counter()
            chan.send((t0, msg))
            sends.append(time.perf_counter() - t0)
        else:
            t0, _ = chan.recv()
            latencies.append(time.perf_counter() - t0)
        dist.all_reduce(one)     # lock-step, as the model's first collective keeps the ranks
    if rank == 1:
        results.put(float(np.median(latencies)) * 1e6)
        if transport == "shm":
            chan.close()
    destroy_group()
    return float(np.median(sends)) * 1e6 if sends else None


def run(transport: str, args) -> tuple[float, float]:
    """(median latency to rank 1, median time rank 0 spends sending), microseconds."""
    ctx = mp.get_context("spawn")
    wakeups = [ctx.Semaphore(0)] if args.wakeup == "semaphore" else None
    shm = ShmBroadcast(None, 1, 0, capacity=16 << 20, wakeups=wakeups) \
        if transport == "shm" else None
    port, results = free_port(), ctx.SimpleQueue()
    peer = ctx.Process(target=_loop, args=(1, port, transport, shm and (shm.name, wakeups),
                                           args, results))
    peer.start()
    try:
        send = _loop(0, port, transport, shm, args, None)
        latency = results.get()
    finally:
        peer.join(30)
        if shm is not None:
            shm.close()
    return latency, send


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seqs", type=int, default=64)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--interval-ms", type=float, default=0.0,
                   help="rank 0 waits this long before each send (the worker's wake-up "
                        "path depends on how long it has waited)")
    p.add_argument("--transports", default="torch,shm")
    p.add_argument("--wakeup", default="semaphore", choices=["semaphore", "poll"],
                   help="how a shm reader waits: spin then semaphore, or spin then sleeps")
    args = p.parse_args()
    size = len(__import__("pickle").dumps(message(args.seqs, args.width), protocol=5))
    for transport in args.transports.split(","):
        latency, send = run(transport, args)
        print(f"{transport:5s}: latency {latency:7.1f} us, rank 0 busy {send:7.1f} us per step "
              f"(medians; message {size} bytes, {args.seqs} seqs x {args.width} blocks, "
              f"sent every {args.interval_ms} ms + the step, {args.wakeup})")


if __name__ == "__main__":
    main()
