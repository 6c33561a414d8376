"""engine/worker/warmup.py's LM-head and token-feed warm-ups: which row counts they run
(CPU, the sync stubbed), and the token feed they warm (step_buffers.gather_fed)."""
from __future__ import annotations

import numpy as np
import torch

from engine import LLM
from engine.worker.warmup import WARM_EVERY_ROWS_UP_TO, warm_up_logits


def test_logits_warm_up_covers_every_row_count_a_mixed_step_samples(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    runner = LLM(model="dummy:tiny", device="cpu", dtype="float32").engine.executor.runner
    seen = []
    real = runner.model.compute_logits

    def compute_logits(hidden, residual):
        seen.append(hidden.shape[0])
        return real(hidden, residual)
    monkeypatch.setattr(runner.model, "compute_logits", compute_logits)
    warm_up_logits(runner, 300)
    assert seen == list(range(1, WARM_EVERY_ROWS_UP_TO + 1)) + [288, 300]
    seen.clear()
    warm_up_logits(runner, 20)
    assert seen == list(range(1, 21))


def test_token_feed_warm_up_meets_every_size_class_both_ways(monkeypatch):
    """Out-of-order feeds (a gather) and feeds with an unfed row (mask and select) at
    every power of two up to the decode capacity, and at the capacity itself: the
    kernels and pinned index buffers a first finishing step would otherwise load."""
    import engine.worker.warmup as warmup
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    seen = []
    real = warmup.gather_fed

    def gather_fed(rows, prev):
        seen.append((rows.shape[0], bool((rows < 0).any()), rows.tolist()))
        return real(rows, prev)
    monkeypatch.setattr(warmup, "gather_fed", gather_fed)
    warmup.warm_up_token_feed(torch.device("cpu"), 24)
    sizes = [1, 2, 4, 8, 16, 24]
    assert [(n, masked) for n, masked, _ in seen] == [(n, m) for n in sizes
                                                       for m in (False, True)]
    for n, masked, rows in seen:
        if masked:
            assert rows.count(-1) == 1
        else:      # a permutation, out of order wherever there are two rows
            assert sorted(rows) == list(range(n)) and (n == 1 or rows != sorted(rows))


def test_gather_fed_orders_and_masks_the_previous_samples():
    from engine.worker.step_buffers import device_fed, gather_fed
    prev = torch.tensor([10, 11, 12, 13])
    same = gather_fed(np.arange(4), prev)
    assert same[0] is prev and same[1] is None          # one to one: no gather
    tokens, mask = gather_fed(np.array([3, 0]), prev)
    assert tokens.tolist() == [13, 10] and mask is None
    ids = torch.tensor([100, 101, 102])
    fed = device_fed(ids, gather_fed(np.array([2, -1, 1]), prev))
    assert fed.tolist() == [12, 101, 11]
