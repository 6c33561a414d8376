"""prompt_logprobs (vLLM's SamplingParams field): the logprob of every prompt token given
the tokens before it, and the top-n there.

The forward computes logits only for `logits_indices` (each sampling chunk's last
token). A prefill chunk of a request that asks adds a logits row for each of its
positions q whose next token q+1 is still in the prompt (the chunk's last row of the
final chunk predicts the first output token: that one is sampled, not a prompt
logprob). Those rows go through the LM head only for such requests, after the step's
other logits rows (engine/core/batch_builder.py), and the runner reduces them on the
device with the model's raw log-softmax (engine/worker/logprobs.py prompt_logprobs).

The host fills `Request.prompt_logprobs` by position, chunk by chunk (a preempted
request recomputes and overwrites its positions), and sends the list once, with the
step that completes the prompt (StepOutput.prompt_logprobs), entry 0 None as in vLLM.
Prefix-cache hits and same-prompt dedup would skip the positions' logits, so the
scheduler gives such a request neither (vLLM disables the prefix cache for them too).
"""
from __future__ import annotations

import numpy as np

from engine.outputs import TokenLogprobs
from engine.worker.logprobs import PackedCopy, unpack


class PromptRows:
    """The prompt-logprob rows of one step: token rows, targets, and whose they are."""

    def __init__(self):
        self.token_rows: list[np.ndarray] = []
        self.targets: list[int] = []
        self.owners: list[tuple] = []     # (request, first position, row count, completes)

    @property
    def num_logprobs(self) -> int:
        return max(r.params.prompt_logprobs for r, *_ in self.owners)


def prompt_rows(prefills: list, first_token_row: int) -> PromptRows | None:
    """The rows of the chunks (laid out from token row `first_token_row` on, in order)
    whose request still waits for its prompt logprobs; None when there is none."""
    if not any(c.request.prompt_logprobs is not None for c in prefills):
        return None
    out, row = PromptRows(), first_token_row
    for c in prefills:
        r = c.request
        if r.prompt_logprobs is not None:
            prompt = r.prompt_token_ids
            end = min(c.start + c.num_tokens, len(prompt) - 1)   # q predicts q + 1
            n = max(end - c.start, 0)
            out.token_rows.append(np.arange(row, row + n, dtype=np.int64))
            out.targets.extend(prompt[c.start + 1:c.start + 1 + n])
            out.owners.append((r, c.start, n, c.start + c.num_tokens >= len(prompt)))
        row += c.num_tokens
    return out if out.owners else None


class PromptLogprobsCopy:
    """A step's prompt logprobs on their way to the host, and the requests they fill."""

    def __init__(self, packed, owners: list):
        self.host = PackedCopy(packed)
        self.owners = owners

    def deliver(self, out) -> None:
        """Fill each owner's positions; a request whose prompt is now complete sends its
        list in `out` (StepOutput.prompt_logprobs) and stops asking."""
        ids, values, ranks = unpack(self.host.array())
        j = 0
        for req, start, n, completes in self.owners:
            lps = req.prompt_logprobs
            if lps is None or req.status.done:   # ended (aborted) meanwhile
                j += n
                continue
            width = req.params.prompt_logprobs + 1
            for k in range(n):
                lps[start + 1 + k] = TokenLogprobs(ids[j][:width], values[j][:width], ranks[j])
                j += 1
            if completes:
                if out.prompt_logprobs is None:
                    out.prompt_logprobs = {}
                out.prompt_logprobs[req.request_id] = lps
                req.prompt_logprobs = None


def take_prompt_logprobs(executor, plan) -> PromptLogprobsCopy | None:
    """The launched step's prompt logprobs (executor.prompt_logprobs), copying to the host,
    for the requests of the rows the batch builder laid out (plan.prompt_rows)."""
    if executor.prompt_logprobs is None:
        return None
    return PromptLogprobsCopy(executor.prompt_logprobs, plan.prompt_rows.owners)
