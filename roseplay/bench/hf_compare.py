"""`bench --compare hf`: HF transformers baselines on the same workload and weights.

Weights: for an HF checkpoint (or the bundled default) both sides load the same files.
For dummy:<preset> models the HF model is built from the same preset config with HF's
own seeded random init, on the CPU, and those tensors are copied into our engine's
model (`share_weights`) before our run: both sides then hold identical weights.
Order: our engine runs first, is closed and its KV pool freed; then the HF model moves
to the device and runs (1) continuous batching (`ContinuousBatchingManager`, the API
under `generate_batch`, with per-request max_new_tokens and recorded timestamps) and
(2) plain `generate` in static batches. All HF requests arrive at t=0 (burst); EOS is
ignored (every request generates exactly its max_tokens), greedy.
"""
from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
import time

import torch

from roseplay.bench.report import RunResult, times_record, wall_duration


def build_hf_model(model_name: str, dtype: torch.dtype, seed: int = 0):
    """The HF model of `model_name` on the CPU in `dtype` (seeded random for dummy:*)."""
    from transformers import AutoModelForCausalLM
    if model_name.startswith("dummy:"):
        from engine.worker.models.presets import preset_hf_config
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(preset_hf_config(model_name.removeprefix("dummy:")),
                                                 dtype=dtype)
    else:
        from engine.worker.models.loader import resolve_model_path
        model = AutoModelForCausalLM.from_pretrained(resolve_model_path(model_name), dtype=dtype)
    return model.eval().requires_grad_(False)


def share_weights(hf_model, engine) -> None:
    """Copy the HF model's tensors into the (idle) engine's model, in place."""
    ours = engine.executor.runner.model
    loaded = ours.load_weights(hf_model.state_dict().items())
    missing = {n for n, _ in ours.named_parameters()} - loaded
    if missing:
        raise RuntimeError(f"HF -> engine weight copy missed {sorted(missing)[:3]}")


def free_device_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@contextlib.contextmanager
def _cpu_memory_probe():
    """HF CB sizes its cache from psutil on CPU; without psutil, report free RAM."""
    try:
        import psutil  # noqa: F401
        yield
        return
    except ImportError:
        pass
    from transformers.generation.continuous_batching import cache
    handler = cache.PagedAttentionMemoryHandler
    original = handler.get_available_memory
    handler.get_available_memory = lambda self: os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        yield
    finally:
        handler.get_available_memory = original


def _cb_config(prompts, max_new, device, max_batch_tokens, cuda_graph: bool):
    from transformers.generation import ContinuousBatchingConfig
    if device.type == "cuda":
        return ContinuousBatchingConfig(use_cuda_graph=cuda_graph)
    block = 16
    blocks = sum(math.ceil((len(p) + m) / block) for p, m in zip(prompts, max_new)) + 4
    return ContinuousBatchingConfig(use_cuda_graph=False, block_size=block, num_blocks=blocks,
                                    max_batch_tokens=max_batch_tokens)


def _cb_generate(model, prompts, max_new, cb_config) -> tuple[list, dict]:
    from transformers import GenerationConfig
    from transformers.generation.continuous_batching.utils import WorkloadHints
    gen = GenerationConfig(max_new_tokens=max(max_new), do_sample=False, eos_token_id=-1,
                           pad_token_id=0)
    hints = WorkloadHints(max_prompt_length=max(len(p) for p in prompts),   # as generate_batch
                          max_generated_length=max(max_new), num_requests=len(prompts))
    results = {}
    with _cpu_memory_probe(), model.continuous_batching_context_manager(
            generation_config=gen, continuous_batching_config=cb_config, block=True, timeout=10,
            workload_hints=hints) as mgr:
        ids = [mgr.add_request(p, max_new_tokens=m, record_timestamps=True, eos_token_id=-1)
               for p, m in zip(prompts, max_new)]
        while len(results) < len(ids):
            r = mgr.get_result(timeout=1)
            if r is None:
                if not mgr.is_running():
                    break
                continue
            if r.is_finished():
                results[r.request_id] = r
    return ids, results


def run_hf_cb(model, prompts: list[list[int]], max_new: list[int], device: torch.device,
              max_batch_tokens: int = 512, warmup: int = 2) -> tuple[RunResult, list]:
    """HF continuous batching; returns the result and each request's generated tokens."""
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.ERROR)   # psutil chatter
    model.set_attn_implementation("paged|sdpa")
    label = "HF CB"
    for graphs in ((True, False) if device.type == "cuda" else (False,)):
        cfg = _cb_config(prompts, max_new, device, max_batch_tokens, graphs)
        try:
            if warmup:
                _cb_generate(model, prompts[:warmup], [min(4, m) for m in max_new[:warmup]], cfg)
            ids, results = _cb_generate(model, prompts, max_new, cfg)
            label = f"HF CB{' +graphs' if graphs else ''}"
            break
        except Exception as exc:
            if not graphs:
                raise
            print(f"HF continuous batching with CUDA graphs failed ({exc!r:.200}); retrying without")
            free_device_memory()
    records, tokens, failed = [], [], 0
    for rid, prompt in zip(ids, prompts):
        r = results.get(rid)
        if r is None or r.error is not None or not r.timestamps:
            failed += 1
            tokens.append(None)
            continue
        records.append(times_record(len(prompt), r.created_time, list(r.timestamps)))
        tokens.append(list(r.generated_tokens))
    return RunResult(label, wall_duration(records), records, failed=failed), tokens


class _StepStamps:
    """A logits processor that timestamps every decoding step of `generate`."""

    def __init__(self):
        self.times: list[float] = []

    def __call__(self, input_ids, scores):
        if scores.is_cuda:
            torch.cuda.synchronize()
        self.times.append(time.perf_counter())
        return scores


def _generate_batch(model, batch, new, device, stamps):
    from transformers import GenerationConfig, LogitsProcessorList
    width = max(len(p) for p in batch)
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    mask = torch.zeros(len(batch), width, dtype=torch.long)
    for i, p in enumerate(batch):           # left padding
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    gc_ = GenerationConfig(max_new_tokens=new, min_new_tokens=new, do_sample=False,
                           eos_token_id=None, pad_token_id=0)
    model.generate(ids.to(device), attention_mask=mask.to(device), generation_config=gc_,
                   logits_processor=LogitsProcessorList([stamps]))


def run_hf_generate(model, prompts: list[list[int]], max_new: list[int], device: torch.device,
                    batch_size: int = 64, warmup: bool = True) -> RunResult:
    """Plain `generate` in static batches (left padded); every request arrives at t=0.

    A batch generates max(its max_tokens); a request counts only its own max_tokens.
    """
    model.set_attn_implementation("sdpa")
    if warmup:
        _generate_batch(model, prompts[:2], min(4, max(max_new)), device, _StepStamps())
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    records = []
    for lo in range(0, len(prompts), batch_size):
        batch, lens = prompts[lo:lo + batch_size], max_new[lo:lo + batch_size]
        stamps = _StepStamps()
        _generate_batch(model, batch, max(lens), device, stamps)
        records += [times_record(len(p), start, stamps.times[:n]) for p, n in zip(batch, lens)]
    return RunResult(f"HF generate (bs {batch_size})", wall_duration(records), records)


def agreement(ours: list[list[int]], theirs: list[list[int] | None]) -> float:
    """Fraction of requests whose generated tokens are identical."""
    pairs = [(a, b) for a, b in zip(ours, theirs) if b is not None]
    return sum(list(a) == list(b) for a, b in pairs) / len(pairs) if pairs else math.nan
