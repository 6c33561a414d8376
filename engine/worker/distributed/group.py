"""The tensor-parallel process group: torch.distributed over a TCP store on 127.0.0.1.

NCCL on CUDA (model collectives, captured by CUDA graphs) plus a gloo group for the CPU
control path (step broadcasts); gloo for both on CPU. Rank r drives cuda:r.
"""
from __future__ import annotations

import datetime
import os
import socket
import sys
import threading

import torch
import torch.distributed as dist

from engine.config import InvalidRequestError
from engine.worker.models.parallel import TPInfo

# NVLink SHARP (multicast) stays off: it needs fabric-manager support the lent hosts lack
CHILD_ENV = {"NCCL_NVLS_ENABLE": "0"}


def free_port() -> int:
    """A free TCP port on 127.0.0.1 for the rendezvous store."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_device(device_type: str, rank: int) -> torch.device:
    return torch.device("cuda", rank) if device_type == "cuda" else torch.device("cpu")


def check_devices(device_type: str, size: int) -> None:
    """N ranks on CUDA need N visible GPUs (rank r on cuda:r)."""
    if device_type == "cuda" and torch.cuda.device_count() < size:
        raise InvalidRequestError(f"tensor_parallel_size {size} needs {size} GPUs, "
                                  f"{torch.cuda.device_count()} visible")


def bind_device(device_type: str, rank: int, size: int) -> None:
    """Rank r uses cuda:r. On the CPU the ranks share the cores: each gets its share of
    intra-op threads (N ranks with every core each oversubscribe the machine, and a rank
    descheduled mid-collective stalls all of them)."""
    if device_type == "cuda":
        check_devices(device_type, rank + 1)
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))


def init_group(tp: TPInfo, port: int, device_type: str, timeout_s: float):
    """Join the group (blocks until every rank has); return the CPU (gloo) control group
    for step broadcasts, apart from the model's collectives and their timeout."""
    os.environ.update(CHILD_ENV)
    backend = "nccl" if device_type == "cuda" else "gloo"
    kwargs = {"device_id": rank_device(device_type, tp.rank)} if device_type == "cuda" else {}
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=tp.rank,
                            world_size=tp.size,
                            timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
    # the control group waits for the next step as long as the engine idles
    return dist.new_group(backend="gloo", timeout=datetime.timedelta(days=365))


def abort_group() -> None:
    """Unblock collectives stuck on a dead peer (NCCL needs an abort; gloo errors out)."""
    if not dist.is_initialized():
        return
    if dist.get_backend() == "nccl":
        from torch.distributed.distributed_c10d import _abort_process_group
        try:
            _abort_process_group()
        except Exception:   # already torn down by NCCL's own watchdog
            pass


def destroy_group(timeout_s: float = 10.0) -> bool:
    """Leave the process group; False if that did not finish within timeout_s (then it is
    left to process exit). NCCL's teardown waits for every CUDA graph that captured one of
    its collectives (release graphs first: ModelRunner.close) and, being collective, for
    the peers: a bounded wait keeps one missed release from hanging a shutdown."""
    if not dist.is_initialized():
        return True
    done = threading.Event()

    def destroy():
        dist.destroy_process_group()
        done.set()
    threading.Thread(target=destroy, name="tp-destroy-group", daemon=True).start()
    if done.wait(timeout_s):
        return True
    print(f"roseplay: destroying the tensor-parallel process group did not finish in "
          f"{timeout_s:.0f} s; left to process exit", file=sys.stderr)
    return False
