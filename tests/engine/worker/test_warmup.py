"""engine/worker/warmup.py's LM-head warm-up: which row counts it runs (CPU, the sync stubbed)."""
from __future__ import annotations

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
