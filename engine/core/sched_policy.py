"""The `scheduling_policy` knob: the order waiting requests are admitted in, and which
running request is preempted when the pool runs dry.

fcfs      arrival order (the queue as it stands: preempted requests at its front);
          the newest admitted request is preempted (vLLM's FCFS).
priority  (priority, arrival) ascending, lower value first; the running request with
          the largest (priority, arrival) is preempted (vLLM's PRIORITY policy).
lpm       the most cached prefix blocks first, ties in queue order (SGLang's lpm); fcfs
          when more than LPM_MAX_QUEUE wait (matching every prompt costs time, SGLang
          does the same) or when prefix caching is off.
"""
from __future__ import annotations

from typing import Callable, Iterable

from engine.request import Request

LPM_MAX_QUEUE = 128


def priority_key(req: Request) -> tuple[int, float]:
    return req.priority, req.arrival_time


def admission_order(waiting: Iterable[Request], policy: str,
                    cached_blocks: Callable[[Request], int] | None) -> list[Request]:
    """The waiting requests in the order admission tries them (sorts are stable)."""
    queue = list(waiting)
    if policy == "priority":
        queue.sort(key=priority_key)
    elif policy == "lpm" and cached_blocks is not None and 1 < len(queue) <= LPM_MAX_QUEUE:
        hits = {id(r): cached_blocks(r) for r in queue}
        queue.sort(key=lambda r: -hits[id(r)])
    return queue


def running_order(running: list[Request], policy: str) -> list[Request]:
    """Running work in the order it reserves blocks: under priority the most important
    first, so the requests left to preempt are the least important ones."""
    return sorted(running, key=priority_key) if policy == "priority" else running


def victim_key(policy: str) -> Callable[[Request], tuple]:
    """The preemption order: the running request with the largest key goes first."""
    if policy == "priority":
        return priority_key
    return lambda r: (r.admit_seq,)
