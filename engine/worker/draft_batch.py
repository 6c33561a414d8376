"""The draft model's inputs as plain arrays (numpy only, like the StepBatch): the core's
DraftProposer builds them (engine/core/draft_proposer.py), the executor's DraftRunner
runs them (engine/worker/draft_runner.py)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class DraftExtend:
    """One extend over several sequences: their tokens flattened, in order."""
    input_ids: np.ndarray       # [T] int64
    positions: np.ndarray       # [T] int64
    slot_mapping: np.ndarray    # [T] int64
    cu_seqlens_q: np.ndarray    # [S+1] int32
    context_lens: np.ndarray    # [S] int32: tokens in the KV once this step is stored
    block_tables: np.ndarray    # [S, M] int32


@dataclass
class DraftChain:
    """n decode forwards of S sequences, one token each per forward, back to back: where
    `feed` is set the input is the previous forward's argmax (a draft fed back), else
    input_ids (a token the host gives). A row past its last forward stores nothing (slot
    -1, context length 1)."""
    input_ids: np.ndarray       # [n, S] int64
    feed: np.ndarray            # [n, S] bool
    positions: np.ndarray       # [n, S] int64
    slot_mapping: np.ndarray    # [n, S] int64
    context_lens: np.ndarray    # [n, S] int32
    block_tables: np.ndarray    # [S, M] int32, M <= max_blocks_per_seq
