"""UniprocExecutor: everything the engine core asks of the model side, in its process.

It owns what engine/worker/executor/setup.py builds as it starts: the loaded model, the
tensor-parallel workers (`TPExecutor`, engine/worker/executor/tp.py), the
kernels, the KV pool's size, the ModelRunner and the draft model's runner; and it
closes them. The core (engine/core/core.py) holds one and reaches the model only
through it: a step goes in as a StepBatch and its tokens come back as a copy on its
way to the host; the core imports no torch.

One process, one rank (TP=1): this class (vLLM's UniProcExecutor). TP>1 subclasses it to send each batch to
ranks 1..N-1 first; every rank samples the same tokens and keeps its own (see
engine/worker/runner.py), so nothing flows back from the workers.
"""
from __future__ import annotations

import torch

from engine.worker.device_io import HostCopy, HostCopyRing
from engine.worker.kv_transfer import KVTransfer
from engine.worker.executor.setup import WorkerSetup
from engine.worker.step_batch import GrammarMask, StepBatch


class UniprocExecutor:
    """Rank 0's model side in the core's process (the only rank at TP=1)."""

    # a step's sampling may wait for its grammar mask after its forward
    # (sample_deferred); TP sends the mask with the batch instead
    defers_sampling = True

    def __init__(self, setup: WorkerSetup, device: torch.device, dtype: torch.dtype):
        loaded = setup.loaded
        self.runner = setup.runner     # looked up at each call (a test may swap it)
        self.draft = setup.draft       # the draft model's DraftRunner (draft_model), or None
        self.device, self.dtype, self.backend = device, dtype, setup.backend
        self.model_name = loaded.name
        self.tokenizer = loaded.tokenizer          # loaded with the model, for the front
        self.eos_token_ids = tuple(loaded.eos_token_ids)
        self.vocab_size = loaded.model.config.vocab_size
        self.max_model_len = setup.max_model_len
        self.num_blocks = setup.num_blocks
        self.default_sampling_params = setup.default_sampling_params   # (EngineInfo's)
        self._host_copies = HostCopyRing()         # the sampled tokens' way to the host

    # -- what the core sizes itself by ---------------------------------------------------
    @property
    def device_type(self) -> str:
        return self.device.type

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    @property
    def host_kv(self):
        """The host tier's pool of this rank (num_blocks, bytes_per_block), or None."""
        return self.runner.host_kv

    @property
    def kv_bytes_per_rank(self) -> int:
        kv = self.runner.kv_cache
        return kv.numel() * kv.element_size()

    @property
    def forward_calls(self) -> int:
        return self.runner.forward_calls

    # -- per step ------------------------------------------------------------------------
    def execute_model(self, batch: StepBatch) -> HostCopy | None:
        """Queue the batch's forward and sampling; the tokens, copying to the host (read
        them with .tolist()), or None when the batch's grammar mask is still to come
        (sample_deferred samples it)."""
        tokens = self._execute(batch)
        # start the copy to the host now: a later .tolist() would be ordered behind (and
        # wait for) the next step, which is launched before these tokens are read
        return None if tokens is None else self._host_copies.start(tokens)

    def _execute(self, batch: StepBatch) -> torch.Tensor | None:
        return self.runner.execute_model(batch)

    def sample_deferred(self, grammar: GrammarMask) -> HostCopy:
        """Sample the step whose forward execute_model ran, now that its mask is known."""
        return self._host_copies.start(self.runner.sample_deferred(grammar))

    def take_logprobs(self, batch: StepBatch):
        """The last step's logprobs (rows that asked), copying to the host; None if none."""
        return self.runner.take_logprobs(batch)

    @property
    def prompt_logprobs(self):
        """The last step's prompt logprobs (engine/core/prompt_logprobs.py reads them)."""
        return self.runner.prompt_logprobs

    def transfer_kv(self, xfer: KVTransfer) -> None:
        """One step's copies between the device pool and the host tier."""
        self.runner.transfer_kv(xfer)

    def kv_copy_seconds(self) -> tuple[float, float]:
        """(to the host, from the host): seconds the tier's completed copies took."""
        return self.runner.kv_copy_seconds()

    def rewind_draws(self) -> None:
        """The launch failed: its seeded draws and penalty counts are undone, so that a
        rerun of its requests draws as if it never had (Sampler.rewind)."""
        self.runner.rewind_draws()

    def release(self, request_id: str) -> None:
        """The request ended: its sampler state goes."""
        self.runner.release((request_id,))

    def close(self) -> None:
        """Drop the CUDA graphs (idempotent); the weights and KV go with the executor."""
        self.runner.close()

