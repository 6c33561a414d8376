"""State codes shared by the engine, its snapshots and every viewer (one owner each).

Torch-free: the TUI's replay mode imports it without a model.
"""
# KV block states (BlockPool.states(), EngineSnapshot.block_state)
BLOCK_FREE, BLOCK_USED, BLOCK_CACHED = 0, 1, 2

# request states shown to users (RequestView.state)
WAITING, PREFILLING, DECODING, PREEMPTED, DEDUP = "waiting", "prefilling", "decoding", "preempted", "dedup"
FINISHED, CANCELLED, ERROR = "finished", "cancelled", "error"
COMPILING = "compiling"      # structured outputs: waiting for its grammar (not yet queued)
# admitted (holding a seat of max_num_seqs): what EngineStats.num_running and
# vllm:num_requests_running count
RUNNING_STATES = (PREFILLING, DECODING, DEDUP)

# finish reasons (vLLM's): RequestOutput.outputs[i].finish_reason, StreamEvent.finish_reason
REASON_STOP, REASON_LENGTH, REASON_CANCELLED, REASON_ERROR = "stop", "length", "cancelled", "error"
ENGINE_CLOSED = "engine closed"   # the error of requests that close() cancelled (any transport)

# engine event kinds (EngineEvent.kind), for the event log and the map's highlights
EV_COW, EV_PREEMPT, EV_EVICT, EV_PREFIX_HIT = "cow", "preempt", "evict", "prefix_hit"
EV_DEDUP_JOIN, EV_CHUNK_DONE = "dedup_join", "chunk_done"
EV_SPEC_VERIFY = "spec_verify"     # drafts verified: proposed, accepted, blocks rolled back
# the host KV tier (docs/KV_TIERS.md): evicted blocks copied to the host, prefix blocks
# copied back, a preemption by swap (out, back in), and a swap the tier could not take
EV_OFFLOAD, EV_RELOAD = "offload", "reload"
EV_SWAP_OUT, EV_SWAP_IN, EV_SWAP_FALLBACK = "swap_out", "swap_in", "swap_fallback"
