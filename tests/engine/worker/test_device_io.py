"""HostCopyRing (engine/worker/device_io.py): host buffers reused in turn, never one whose copy
is still unread. (CPU tensors take the same path, unpinned and without events.)"""
import torch

from engine.worker.device_io import HostCopyRing


def test_steady_reads_reuse_the_slots():
    ring = HostCopyRing(slots=3)
    inflight = ring.start(torch.tensor([0, 0]))
    for step in range(1, 50):       # async scheduling: start N+1, then read N
        nxt = ring.start(torch.tensor([step, -step]))
        assert inflight.tolist() == [step - 1, 1 - step]
        inflight = nxt
    assert ring.allocations == 3


def test_an_unread_copy_is_never_overwritten():
    ring = HostCopyRing(slots=2)
    kept = ring.start(torch.tensor([7, 8, 9]))          # never read (a failed step's)
    for step in range(6):
        assert ring.start(torch.tensor([step] * 3)).tolist() == [step] * 3
    assert kept.tolist() == [7, 8, 9]
    assert ring.allocations == 3      # its slot took a new buffer once, then reused it


def test_a_wider_step_or_another_dtype_takes_a_new_buffer():
    ring = HostCopyRing(slots=1, min_size=4)
    assert ring.start(torch.arange(3)).tolist() == [0, 1, 2]
    assert ring.start(torch.arange(9)).tolist() == list(range(9))
    assert ring.start(torch.tensor([1.5])).tolist() == [1.5]
    assert ring.start(torch.arange(2)).tolist() == [0, 1]
    assert ring.allocations == 4
