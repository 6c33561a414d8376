"""Rank 0's side of a tensor-parallel step: every rank runs the same batch.

`TPExecutor` is the core's Executor (engine/worker/executor/) at TP>1: it sends each
batch to ranks 1..N-1 (with the requests whose sampler state ended since the last
step), then runs rank 0's runner; every rank samples the same tokens and keeps its own
(see engine/worker/runner.py), so nothing flows back from the workers. Closing it stops
the workers and leaves the process group.
"""
from __future__ import annotations

import torch

from engine.worker.executor.uniproc import UniprocExecutor
from engine.worker.step_batch import StepBatch


class TPExecutor(UniprocExecutor):
    defers_sampling = False      # the grammar mask goes with the batch to every rank

    def __init__(self, setup, device: torch.device, dtype: torch.dtype):
        super().__init__(setup, device, dtype)
        self.group = setup.tp_group        # TPWorkerGroup of ranks 1..N-1
        self._released: list[str] = []

    def _execute(self, batch: StepBatch) -> torch.Tensor | None:
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

    def rewind_draws(self) -> None:
        """Every rank undoes the failed launch's draws (the workers before their next
        step: their messages keep their order)."""
        self.group.send_rewind()
        self.runner.rewind_draws()

    def close(self) -> None:
        """Stop the workers; rank 0's CUDA graphs go first (they may hold the NCCL
        communicator the group's teardown waits for). After a rank died, syncing the
        device could wait on a collective forever: the graphs are left then."""
        if self.group.error is None:
            self.runner.close()
        self.group.shutdown()
