"""CUDA graphs of whole steps, one per bucket, over the persistent buffers of
engine/worker/step_buffers.py.

Two kinds of graph, one mechanism (same buffers, same capture loop, same replay):
  * decode: decode-only steps, one graph per bucketed batch size (DECODE_BUCKETS), the
    split-K decode attention, the LM head and the greedy argmax inside the graph (batch-1
    latency: the argmax is used when every row is greedy, else the sampler runs after);
  * verify: decode-only steps with speculative decoding's verified positions (several
    decode rows per request, docs/SPECULATIVE.md), one graph per bucketed row count up
    to the configured k's widest step (VERIFY_BUCKETS, captured only when the engine
    starts with speculation): the decode graph, its attention told that rows of one
    request see each other's K/V (rotary_decode_attention's rows_shared);
  * mixed: any step (prefill chunks and decodes, or decodes beyond the largest decode
    bucket), one graph per bucketed token count (MIXED_BUCKETS, capped by
    max_num_batched_tokens), the unified attention kernel (kernels/unified_attention.py,
    whose launch depends on capacities only), everything up to the hidden states of the
    rows that sample; the LM head runs after the replay on exactly those rows.
A step takes the smallest bucket that holds it, padded; a step no graph holds (a larger
budget set live, more sequences than the capacity) runs eagerly unpadded.

Without capture (enforce_eager) the same padded buffers run eagerly, so eager and graph
steps have identical shapes, hence identical kernels and bit-identical results.
cudagraph_mode="full_decode_only" keeps mixed steps on the eager unpadded path.
"""
from __future__ import annotations

import bisect
import gc

import torch

from engine.worker.step_buffers import StepBuffers

DECODE_BUCKETS = [1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256,
                  320, 384, 448, 512, 640, 768, 896, 1024]
# padding costs GEMM work in proportion: steps of 25-33% apart up to the budget
MIXED_BUCKETS = [16, 32, 64, 128, 192, 256, 320, 384, 512, 640, 768, 1024, 1280, 1536,
                 2048, 2560, 3072, 4096, 5120, 6144, 8192, 10240, 12288, 16384]


def mixed_buckets(max_tokens: int) -> list[int]:
    """Buckets up to the token budget, the budget itself the largest."""
    return [b for b in MIXED_BUCKETS if b < max_tokens] + [max_tokens]


def verify_buckets(max_rows: int) -> list[int]:
    """Decode buckets up to the first that holds max_rows (none for 0)."""
    if max_rows <= 0:
        return []
    last = bisect.bisect_left(DECODE_BUCKETS, min(max_rows, DECODE_BUCKETS[-1]))
    return DECODE_BUCKETS[:last + 1]


class StepGraphs:
    def __init__(self, runner, max_batch: int, use_graphs: bool = True, pad: bool = True,
                 max_mixed_tokens: int = 0, max_verify_rows: int = 0):
        """max_batch: largest decode batch. max_mixed_tokens: token budget of mixed-step
        graphs (0: none). max_verify_rows: decode rows of the widest verify step (0: no
        verify graphs). The sequence capacity of mixed steps is the widest of them all
        (a mixed step's verified positions are decode rows too)."""
        self.runner = runner
        self.use_graphs = use_graphs
        self.pad = pad or use_graphs   # unpadded only for the CPU overlap path
        self.decode_buckets = [b for b in DECODE_BUCKETS if b <= max_batch] or [1]
        self.verify_buckets = verify_buckets(max_verify_rows)
        self.mixed_buckets = mixed_buckets(max_mixed_tokens) if max_mixed_tokens else []
        self.max_seqs = max([self.decode_buckets[-1], max_batch] + self.verify_buckets)
        max_tokens = max([self.decode_buckets[-1]] + self.verify_buckets + self.mixed_buckets)
        self.buffers = StepBuffers(runner.device, max_tokens, self.max_seqs,
                                   runner.max_blocks_per_seq, self.max_seqs)
        self.graphs: dict[tuple[str, int], tuple[torch.cuda.CUDAGraph, tuple]] = {}
        self.replays = {"decode": 0, "verify": 0, "mixed": 0}   # steps through the buffers
        self.greedy: torch.Tensor | None = None    # the last run's argmax rows (decode graphs)
        self._verify_out: torch.Tensor | None = None   # see _verify_logits

    @property
    def buckets(self) -> list[int]:      # the decode buckets (scripts/profile_*.py)
        return self.decode_buckets

    def key(self, batch) -> tuple[str, int] | None:
        """(kind, bucket) of the graph that runs this StepBatch, or None (eager)."""
        if batch.decode_only:
            kind, b = ("decode", self.decode_buckets) if batch.draft_rows is None \
                else ("verify", self.verify_buckets)
            n = batch.num_decodes
            if b and n <= b[-1]:
                return kind, b[bisect.bisect_left(b, n)] if self.pad else n
        n, b = batch.num_tokens, self.mixed_buckets
        if b and n <= b[-1] and batch.num_decodes + batch.num_prefills <= self.max_seqs:
            return "mixed", b[bisect.bisect_left(b, n)]
        return None

    # -- forward of one bucket (captured, or run eagerly) ----------------------------------
    def _forward(self, kind: str, size: int) -> tuple:
        buf, model = self.buffers, self.runner.model
        ids, positions, _ = buf.views(size)
        if kind != "mixed":         # every row samples: no logits rows to gather
            logits = model(ids, positions, buf.decode_meta(size, kind == "verify"), None)
            if not self.use_graphs:     # eager: the sampler takes the argmax itself
                return (logits,)
            if kind == "verify":
                logits = self._verify_logits(logits)
            return logits, self.runner.ops.argmax(logits)
        rows = min(size, self.max_seqs)
        return model.hidden_rows(ids, positions, buf.mixed_meta(size),
                                 buf.logits_indices[:rows])

    def _verify_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The verify graphs' logits, copied into one buffer that all of them share: a
        graph's own output stays allocated as long as the graph, and verify buckets up to
        1024 rows of a 150k vocabulary would hold about 2 GB that way (the copy costs
        less than 1% of a step). Allocated by the largest bucket's warm-up, before any
        capture."""
        if self._verify_out is None or self._verify_out.shape[0] < logits.shape[0]:
            self._verify_out = torch.empty_like(logits)
        return self._verify_out[:logits.shape[0]].copy_(logits)

    def _keys(self) -> list[tuple[str, int]]:
        """Largest first, so smaller captures reuse the pool's freed blocks."""
        keys = [("mixed", b) for b in self.mixed_buckets] + \
               [("verify", b) for b in self.verify_buckets] + \
               [("decode", b) for b in self.decode_buckets]
        return sorted(keys, key=lambda k: -k[1])

    @torch.inference_mode()
    def warm(self) -> None:
        """Eager mode: run every bucket once, so its kernels compile now, not mid-serving
        (the buffers hold no slots: nothing is written to the KV cache)."""
        for kind, size in self._keys():
            self.buffers.reset(size)
            self._forward(kind, size)
        self.buffers.warm_decode_inputs()
        torch.cuda.synchronize()

    @torch.inference_mode()
    def capture(self) -> None:
        # A dropped engine held by reference cycles dies in some automatic gc run; if
        # that run falls inside a capture, destroying its graphs invalidates the capture
        # (and leaves torch's CUDA RNG unusable for the whole process). Collect now,
        # and not during capture.
        gc.collect()
        gc_enabled = gc.isenabled()
        gc.disable()
        try:
            self._capture_all()
        finally:
            if gc_enabled:
                gc.enable()

    def _capture_all(self) -> None:
        self.buffers.warm_decode_inputs()
        pool = torch.cuda.graph_pool_handle()      # one memory pool for every capture
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for kind, size in self._keys():
                self.buffers.reset(size)      # no slot: the warm-up stores nothing
                self._forward(kind, size)     # warm up: compile kernels, settle allocations
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    out = self._forward(kind, size)
                self.graphs[(kind, size)] = (graph, out)
        torch.cuda.current_stream().wait_stream(stream)
        if self.runner.model.tp.size == 1:   # (under TP every rank would have to join)
            for kind, size in self._keys():   # a graph's first replay uploads it (slow):
                self.buffers.reset(size)      # now, not in the first burst; no slot: the
                self.graphs[(kind, size)][0].replay()     # replay stores nothing
        torch.cuda.synchronize()

    def release(self) -> None:
        """Destroy the captured graphs (before a process group whose collectives they
        captured is destroyed: NCCL waits for every such graph to be gone)."""
        if not self.graphs:
            return
        torch.cuda.synchronize()
        for graph, _ in self.graphs.values():
            graph.reset()
        self.graphs.clear()

    # -- per step --------------------------------------------------------------------------
    def run(self, batch, token_source: tuple | None = None,
            key: tuple[str, int] | None = None) -> torch.Tensor:
        """Run a StepBatch that key() accepts (key: its key(), if the caller has it);
        return the logits of its logits rows. token_source: (tokens, mask) of the decodes
        whose inputs are the previous step's samples on the device
        (step_buffers.device_fed), else all come from batch.input_ids."""
        kind, size = key or self.key(batch)
        self.buffers.fill(batch, size, kind == "mixed", token_source)
        self.replays[kind] += 1
        if self.use_graphs:
            graph, out = self.graphs[(kind, size)]
            graph.replay()
        else:
            out = self._forward(kind, size)
        rows = batch.logits_indices.shape[0]
        self.greedy = out[1][:rows] if kind != "mixed" and len(out) > 1 else None
        if kind != "mixed":
            return out[0][:rows]
        return self.runner.model.compute_logits(*(t[:rows] for t in out))
