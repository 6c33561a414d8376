"""Knob names and values in the words the panels use (Knobs, the guide scorecard, the
compare screen, the time axis's marks)."""

SHORT_NAMES = {"enable_prefix_caching": "prefix cache", "max_num_batched_tokens": "budget",
               "max_num_seqs": "max seqs", "scheduling_mode": "step", "scheduling_policy": "queue",
               "eviction_policy": "evict", "num_speculative_tokens": "spec k",
               "preemption_mode": "preempt", "routing_policy": "route",
               "concurrency": "in flight", "request rate": "rate"}


def fmt_value(name: str, value) -> str:
    if isinstance(value, bool):
        return "ON" if value else "OFF"
    if name == "max_num_batched_tokens":
        return f"{value} tok/step"
    if name == "num_speculative_tokens":
        return f"{value} drafts" if value else "OFF"
    return str(value)
