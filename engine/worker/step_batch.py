"""The step batch: one engine step as plain arrays (built by engine/core/batch_builder.py).

Everything downstream of the scheduler (the runner, the CUDA graphs, the sampler, and
the tensor-parallel workers that receive it) reads a `StepBatch` and nothing else: no
live `Request` objects, no scheduler types. It is frozen, made of numpy arrays and
plain values, so it can be copied to another process as it is.

Token layout: decodes first (one token each; speculative decoding's verified positions
are decode rows after the plain decodes, several per request), then prefill chunks.
Logits are computed for `logits_indices` (every decode row, the last token of every
chunk that samples); `sample_rows` maps each sample to its logits row (a dedup follower
repeats its leader's row).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingExtras:
    """Columns of the rarer sampling fields (penalties, logit bias, min_p, min_tokens,
    logprobs): built only on a step where some row uses one (engine/core/sampling_extras.py).
    Pairs (row, token) are flat, so each field is one scatter on the device."""
    penalty_rows: np.ndarray       # [P] int64 sample rows with a penalty
    presence: np.ndarray           # [P] float32
    frequency: np.ndarray          # [P] float32
    repetition: np.ndarray         # [P] float32
    first_sample: np.ndarray       # [P] bool: no output yet: reset its counts from its prompt
    prompt_ids: np.ndarray         # [sum of prompt_lens] int64 prompts of first_sample rows
    prompt_lens: np.ndarray        # [F] int64, one per first_sample row, in row order
    bias_rows: np.ndarray          # [B] int64 logit_bias: row, token, value
    bias_tokens: np.ndarray        # [B] int64
    bias_values: np.ndarray        # [B] float32
    mask_rows: np.ndarray          # [M] int64 min_tokens: (row, stop token) masked to -inf
    mask_tokens: np.ndarray        # [M] int64
    min_p: np.ndarray | None       # [R] float32 (None: no row uses it)
    logprob_rows: np.ndarray       # [L] int64 rows whose logprobs go to the host
    num_logprobs: int              # top-n of those rows (the largest asked)
    raw_rows: np.ndarray | None = None   # [Q] int64 those of them (indices into
    #                                logprob_rows) that also want the model's own top-n

    @property
    def only_logprobs(self) -> bool:
        """No row's logits are altered (no penalty, bias, min_p or min_tokens mask): the
        tokens are the plain path's, and only the logprob rows need more work."""
        return not (self.penalty_rows.size or self.bias_rows.size or self.mask_rows.size
                    or self.min_p is not None)


@dataclass(frozen=True)
class GrammarMask:
    """Structured outputs (docs/STRUCTURED_OUTPUTS.md): the sample rows a grammar constrains and
    their packed token bitmask (bit t of row i's words allows token t), filled by the
    core's grammar matchers. bitmask None: the step's forward runs first and the mask
    comes with its sampling (engine/core/core.py: async scheduling, a constrained
    request's previous token still unread)."""
    rows: np.ndarray                   # [C] int64 sample rows
    bitmask: np.ndarray | None = None  # [C, ceil(V / 32)] int32


@dataclass(frozen=True)
class SamplingColumns:
    """Sampling parameters of every sample row, as columns."""
    request_ids: tuple[str, ...]   # seeded rows draw from a generator kept per request id
    all_greedy: bool
    greedy: np.ndarray             # [R] bool
    temperature: np.ndarray        # [R] float32 (1.0 on greedy rows)
    top_k: np.ndarray              # [R] int64 (<= 0: no cut)
    top_p: np.ndarray              # [R] float32
    seeded: np.ndarray             # [R] bool
    seed: np.ndarray               # [R] uint64 (0 on unseeded rows)
    extras: SamplingExtras | None = None   # None: the fast paths (plain greedy: argmax)


@dataclass(frozen=True)
class StepBatch:
    input_ids: np.ndarray              # [T] int64 (decode rows from the device if prev_token_rows)
    positions: np.ndarray              # [T] int64
    slot_mapping: np.ndarray           # [T] int64 KV slot each token writes
    num_decodes: int                   # D: tokens [0, D) are decodes
    decode_block_tables: np.ndarray    # [D, W] int32
    decode_context_lens: np.ndarray    # [D] int32
    prefill_block_tables: np.ndarray   # [P, W] int32
    prefill_cu_seqlens_q: np.ndarray   # [P+1] int32
    prefill_context_lens: np.ndarray   # [P] int32
    prefill_max_seqlen_q: int
    logits_indices: np.ndarray         # [L] int64 token rows whose logits are computed
    sample_rows: np.ndarray            # [R] int64 logits row of each sample
    cow_src: np.ndarray                # [C] int64 copy-on-write: block copied ...
    cow_dst: np.ndarray                # [C] int64 ... into this one, before the forward
    sampling: SamplingColumns
    prev_token_rows: np.ndarray | None = None   # [D] async scheduling: decode i's input is
    #                  the previous step's sample prev_token_rows[i] (-1: input_ids[i])
    prev_rows_in_order: bool = False   # prev_token_rows is 0..D-1: decode i takes sample i
    # speculative decoding (docs/SPECULATIVE.md): the sample rows of verified positions (one
    # contiguous range; their decode rows follow the plain decodes) and the draft token
    # each one checks (-1: the bonus row after a request's drafts)
    draft_rows: np.ndarray | None = None     # [N] int64
    draft_ids: np.ndarray | None = None      # [N] int64
    # prompt_logprobs (engine/core/prompt_logprobs.py): logits rows of prompt positions
    # (after every other logits row, never sampled), the prompt token each predicts, top-n
    prompt_logprob_rows: np.ndarray | None = None      # [P] int64 (None: no row asked)
    prompt_logprob_targets: np.ndarray | None = None   # [P] int64
    num_prompt_logprobs: int = 0
    grammar: GrammarMask | None = None   # structured outputs' rows and bitmask

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])

    @property
    def num_prefills(self) -> int:
        return int(self.prefill_context_lens.shape[0])

    @property
    def decode_only(self) -> bool:
        return self.num_prefills == 0

    @property
    def samples_in_order(self) -> bool:
        """Every logits row is sampled once, in order (no follower repeats a row). Not
        with prompt-logprob rows: they follow the sampled rows and sample nothing, so a
        follower's repeat could make the counts equal while the rows differ."""
        return self.prompt_logprob_rows is None and \
            self.sample_rows.shape[0] == self.logits_indices.shape[0]
