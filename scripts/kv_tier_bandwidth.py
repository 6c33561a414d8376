"""The host KV tier's copy bandwidth against the host link's (GPU): one step's batched
copies (engine/worker/kv_transfer.py: a gather on the device and a scatter through the
pinned pool's CUDA view, each way) of N scattered blocks, and a plain pinned memcpy of
the same bytes (the copy engine: what the link gives), each direction, median of --runs.

    python scripts/kv_tier_bandwidth.py                       # qwen3-0.6b's KV shape, bf16
    python scripts/kv_tier_bandwidth.py --layers 24 --kv-heads 2 --head-dim 64   # qwen2.5-0.5b
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np
import torch

from engine.worker.kv_transfer import HostKVCache, KVTransfer


def timed(fn, runs: int, after=None) -> float:
    """Median seconds of fn() over `runs`, by CUDA events on the current stream, which
    first waits for stream `after` (the tier's copy stream: an offload's write ends
    there)."""
    times = []
    for _ in range(runs + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        if after is not None:
            torch.cuda.current_stream().wait_stream(after)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--device-blocks", type=int, default=4096)
    ap.add_argument("--host-blocks", type=int, default=4096)
    ap.add_argument("--blocks", type=int, nargs="+", default=[8, 64, 512],
                    help="blocks copied in one step")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    kv = torch.zeros(2, args.layers, args.device_blocks, args.block_size, args.kv_heads,
                     args.head_dim, dtype=torch.bfloat16, device="cuda")
    host = HostKVCache(kv, args.host_blocks)
    rng = np.random.default_rng(0)
    print(f"block: {host.bytes_per_block / 2 ** 20:.2f} MiB; pinned pool "
          f"{host.host.untyped_storage().nbytes() / 2 ** 30:.2f} GiB")
    print(f"{'blocks':>7} {'MiB':>8} {'offload GB/s':>13} {'reload GB/s':>12} "
          f"{'memcpy D2H':>11} {'memcpy H2D':>11}")
    for n in args.blocks:
        dev = rng.choice(args.device_blocks, n, replace=False).astype(np.int64)
        hst = rng.choice(args.host_blocks, n, replace=False).astype(np.int64)
        none = np.zeros(0, np.int64)
        nbytes = n * host.bytes_per_block
        out = timed(lambda: host.transfer(KVTransfer(dev, hst, none, none)), args.runs,
                    host.stream)
        back = timed(lambda: host.transfer(KVTransfer(none, none, hst, dev)), args.runs,
                     host.stream)
        pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        flat = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        d2h = timed(lambda: pinned.copy_(flat, non_blocking=True), args.runs)
        h2d = timed(lambda: flat.copy_(pinned, non_blocking=True), args.runs)
        gbps = lambda s: nbytes / s / 1e9
        print(f"{n:>7} {nbytes / 2 ** 20:>8.1f} {gbps(out):>13.1f} {gbps(back):>12.1f} "
              f"{gbps(d2h):>11.1f} {gbps(h2d):>11.1f}")


if __name__ == "__main__":
    main()
