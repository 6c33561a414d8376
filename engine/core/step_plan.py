"""What one step computes, as the scheduler plans it (engine/core/scheduler.py) and the
batch builder, the launch, the commit and speculative decoding read it: the chunks of
requests, the copies and preemptions, the drafts to verify."""
from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from engine.request import Request


class ScheduledChunk(msgspec.Struct, eq=False):
    """Part of a request computed in one step (a msgspec Struct: its constructor runs in C,
    and a wide step makes one per decode; identity equality, as a plain object's)."""
    request: Request
    start: int           # first position computed this step
    num_tokens: int
    sample: bool         # reaches the end of the known tokens: sample after it

    def __repr__(self) -> str:
        return (f"ScheduledChunk({self.request.request_id!r}, start={self.start}, "
                f"num_tokens={self.num_tokens}, sample={self.sample})")


class VerifyChunk:
    """A decode with drafts (speculative decoding): its last token and the drafts, 1 +
    len(draft) positions computed as decode rows of the step, each sampled (a
    ScheduledChunk's fields, and its own)."""
    __slots__ = ("request", "start", "num_tokens", "sample", "draft", "accepted",
                 "rolled_back")

    def __init__(self, request: Request, start: int, draft: list[int]):
        self.request, self.start, self.num_tokens, self.sample = \
            request, start, 1 + len(draft), True
        self.draft = draft
        self.accepted = 0                 # set when its tokens are read (spec_decode.py)
        self.rolled_back: tuple[int, ...] = ()   # blocks freed: they held rejected slots


@dataclass
class StepPlan:
    decodes: list[ScheduledChunk] = field(default_factory=list)
    prefills: list[ScheduledChunk] = field(default_factory=list)
    copies: list[tuple[int, int, str]] = field(default_factory=list)   # COW (src, dst, request id)
    preempted: list[tuple[Request, tuple[int, ...]]] = field(default_factory=list)  # (req, blocks freed)
    prefix_hits: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)   # (request id, blocks)
    dedup_joins: list[tuple[str, str]] = field(default_factory=list)   # (follower id, leader id)
    verifies: list[VerifyChunk] = field(default_factory=list)   # decodes with drafts
    spec_waiting: bool = False   # a decode's proposer waits for its token (spec_decode.py)
    spec_off: int = 0            # decodes when past disable_by_batch_size: no drafts (ditto)
    spec_positions: tuple = ()   # its verifies by draft position once read: (drafted,
    #                              accepted) tuples (spec_decode.step_positions)
    prompt_rows: object = None   # its prompt-logprob rows, laid out by the batch builder
    swap_fallbacks: list[str] = field(default_factory=list)   # swap preemptions that
    #                              recompute instead (the host tier is off or full)
    tier_step: object = None     # the host tier's copies sent for it (host_tier.TierStep)
    kv_error: Exception | None = None   # those copies failed: the plan fails at launch
    decode_columns: object = None   # its decodes' kept columns, when they step on from
    #                              the last plan's (engine/core/steady_decodes.py)
    budget: int = 0              # the knobs it was planned under (the step's stats):
    mode: str = ""               # max_num_batched_tokens and scheduling_mode

    @property
    def chunks(self) -> list[ScheduledChunk]:
        return self.decodes + self.prefills + self.verifies

    @property
    def num_tokens(self) -> int:
        return len(self.decodes) + sum(c.num_tokens for c in self.prefills) \
            + sum(c.num_tokens for c in self.verifies)

    @property
    def prefix_hit_blocks(self) -> int:
        return sum(len(blocks) for _, blocks in self.prefix_hits)

    def __bool__(self) -> bool:
        return bool(self.decodes or self.prefills or self.verifies)
