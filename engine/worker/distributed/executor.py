"""Rank 0's side of a tensor-parallel step: every rank runs the same batch.

The engine core drives either its ModelRunner (TP=1) or a `TPExecutor` (TP>1) through
the same two calls, `execute_model(batch) -> tokens on the device` and
`release(request_id)`, so the step path is one for every N. The executor sends the batch
to ranks 1..N-1 (with the requests whose sampler state ended since the last step), then
runs rank 0's runner; every rank samples the same tokens and keeps its own (see
engine/worker/runner.py), so nothing flows back from the workers.
"""
from __future__ import annotations

import torch

from engine.worker.step_batch import StepBatch


class TPExecutor:
    def __init__(self, group, runner):
        self.group, self.runner = group, runner
        self._released: list[str] = []

    def execute_model(self, batch: StepBatch) -> torch.Tensor:
        released, self._released = self._released, []
        return self.group.run(batch, self.runner.execute_model, released)

    def transfer_kv(self, xfer) -> None:
        """Every rank copies its shard of the step's blocks between the tiers."""
        self.group.send_transfer(xfer)
        self.runner.transfer_kv(xfer)

    def release(self, request_id: str) -> None:
        """Rank 0 drops the request's sampler state now, the workers before their next
        step (in the same order relative to the steps as rank 0)."""
        self.runner.release((request_id,))
        self._released.append(request_id)
