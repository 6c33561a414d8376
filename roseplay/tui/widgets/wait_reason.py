"""Why the request list's waiting rows wait: the seat limit, the token budget, or a
pool too full for any queued request's next chunk (RequestList's progress column); and
which of them the free seats leave behind (`seat_reasons`)."""
from __future__ import annotations

from engine.codes import RUNNING_STATES

ADMITTED = "admitted at the next step"


def waiting_reason(snap) -> str:
    """Why waiting requests wait: the seat limit, the token budget, or KV blocks."""
    k, s = snap.knobs, snap.last_step
    running = sum(r.state in RUNNING_STATES for r in snap.requests)
    if running >= k.max_num_seqs:
        return f"max_num_seqs {k.max_num_seqs} full"
    if s is not None and s.decode_tokens + s.prefill_tokens >= k.max_num_batched_tokens:
        return "token budget used up"
    room = snap.num_free + snap.num_cached      # cached blocks are evicted on demand
    if room == 0:
        return "no free KV block"
    need = blocks_wanted(snap)
    if need is not None and need > room:
        return f"needs {need} KV blocks, {room} free"
    return ADMITTED


def seat_reasons(snap, reason: str) -> dict[str, str]:
    """The queued requests the free seats leave behind, each with the seat limit as its
    reason, when `reason` says the next step admits: with 15 of 16 seats taken, all 16
    queued rows read "admitted at the next step" and one was. The admission order is
    engine/core/sched_policy.py's: fcfs preempted requests first, then arrival; priority
    (priority, arrival); lpm's (the most cached prefix first) is the engine's to know,
    and its rows keep `reason`."""
    k = snap.knobs
    if reason != ADMITTED or k.scheduling_policy == "lpm":
        return {}
    seats = k.max_num_seqs - sum(r.state in RUNNING_STATES for r in snap.requests)
    queue = [r for r in snap.requests if r.state in ("waiting", "preempted")]
    if k.scheduling_policy == "priority":
        queue.sort(key=lambda r: (r.priority, r.arrival_time))
    else:
        queue.sort(key=lambda r: (r.state != "preempted", r.arrival_time))
    full = f"max_num_seqs {k.max_num_seqs} full"
    return {r.request_id: full for r in queue[max(0, seats):]}


def blocks_wanted(snap) -> int | None:
    """The fewest blocks a queued request's next chunk takes (its tokens left, at most
    the budget): a pool with fewer free or cached blocks admits none of them, which read
    "admitted at the next step" for 17 s on a full pool with 6 cached blocks."""
    budget, size = snap.knobs.max_num_batched_tokens, max(1, snap.block_size)
    wants = [-(-min(r.prompt_tokens + r.output_tokens - r.computed_tokens, budget) // size)
             for r in snap.requests if r.state in ("waiting", "preempted")]
    return min(wants) if wants else None


# a reason's start, then shorter forms: 80x24's progress column has 8 cells (it read
# "seqs fu…", "budget …", "next st…")
SHORT_REASONS = (("max_num_seqs", "seqs full", "no seat"),
                 ("token budget", "budget full", "budget"),
                 ("no free KV", "no KV block", "no block"), ("needs", "KV too full", "KV full"),
                 ("admitted", "next step", "up next"))


def short_reason(reason: str, width: int = 11) -> str:
    """A waiting reason in a narrow progress column, the longest form that fits `width`
    (the full words are in ? help)."""
    forms = next((f[1:] for f in SHORT_REASONS if reason.startswith(f[0])), (reason,))
    return next((f for f in forms if len(f) <= width), forms[-1])
