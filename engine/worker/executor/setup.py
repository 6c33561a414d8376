"""The model side, built once as the executor starts: the model loaded (with tensor
parallelism, ranks 1..N-1 first, loading their shards alongside rank 0), the attention
backend resolved, the KV cache sized in blocks (a draft model resident too), the draft
model's runner and the ModelRunner every step runs on. The executor
(engine/worker/executor/) wraps what this builds; the core never calls it."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from engine.config import (DEFAULT_CPU_BLOCKS, EngineConfig, InvalidRequestError,
                           SpeculativeConfig, resolve_max_model_len)
from engine.worker.draft_runner import DraftRunner, build_draft_runner
from engine.worker.models.config_check import ConfigFiles, context_length, local_context_length
from engine.worker.models.loader import LoadedModel, default_sampling_params, load_model
from engine.worker.placement import (blocks_from_memory, kv_bytes_per_block,
                                     resolve_kv_cache_dtype)
from engine.worker.runner import ModelRunner
from kernels import INTERPRETED, default_cpu_backend, get_ops
from kernels.cpu_native_build import build_in_background


@dataclass
class WorkerSetup:
    loaded: LoadedModel
    backend: str                     # the attention backend, "auto" resolved
    max_model_len: int               # the config's (at most the model's), else the model's
    num_blocks: int                  # the target model's KV blocks (the pool's size)
    draft: DraftRunner | None        # speculative method draft_model, else None
    runner: ModelRunner
    tp_group: object = None          # TPWorkerGroup of ranks 1..N-1 (engine/worker/distributed)
    # the model's generation-config sampling defaults (EngineConfig.generation_config)
    default_sampling_params: dict = dataclasses.field(default_factory=dict)


def setup_worker(config: EngineConfig, device: torch.device,
                 dtype: torch.dtype) -> WorkerSetup:
    """Load the model and build the runner; a failure stops the workers it started."""
    files = ConfigFiles()      # the checkpoint's config files, read once for the start
    if (local := local_context_length(config.model, files)) is not None:
        resolve_max_model_len(config.max_model_len, local)     # refused before the load
    defaults = default_sampling_params(config.model, config.generation_config,   # likewise
                                       config.override_generation_config, files)
    backend = config.attention_backend
    if backend == "triton" and device.type == "cpu" and not INTERPRETED:
        # else it loads, then every step fails in Triton ("0 active drivers")
        raise InvalidRequestError("attention_backend triton needs a CUDA device (or "
                                  "TRITON_INTERPRET=1, Triton's slow CPU interpreter); on "
                                  "the CPU: auto, cpu_native, torch_sdpa or torch")
    if backend == "auto" and device.type == "cuda":
        backend = "triton"
    elif backend == "auto" and config.kv_cache_dtype != "auto":
        backend = "torch_sdpa"      # cpu_native's C kernels read float32 KV only
    elif backend == "auto":
        build_in_background()       # on a first launch cc runs while the model loads
    if config.tensor_parallel_size == 1:
        loaded = load_model(config.model, device, dtype, config.seed, files=files)
        return _build_runner(config, device, dtype, loaded, _resolve_backend(backend), None,
                             defaults)
    from engine.worker.distributed.worker import TPWorkerGroup, WorkerSpec
    backend = _resolve_backend(backend)          # the workers are told it
    group = TPWorkerGroup(WorkerSpec(
        config.model, config.tensor_parallel_size, device.type,
        str(dtype).removeprefix("torch."), config.seed, attention_backend=backend))
    try:
        loaded = load_model(config.model, device, dtype, config.seed, tp=group.start(),
                            files=files)
        group.wait_ready()
        return _build_runner(config, device, dtype, loaded, backend, group, defaults)
    except BaseException:
        group.shutdown()
        raise


def _resolve_backend(backend: str) -> str:
    """auto on CPU: cpu_native where its C kernels built (waits for the build), else
    torch_sdpa."""
    return default_cpu_backend() if backend == "auto" else backend


def _num_blocks(config: EngineConfig, device: torch.device, per_block: int,
                model_dtype_block: int) -> int:
    """The configured count, else what the GPU's free memory holds; on CPU the bytes of
    DEFAULT_CPU_BLOCKS blocks in the model's dtype (so an fp8 pool, same bytes, holds
    more blocks, as on the GPU)."""
    return config.num_blocks or (
        blocks_from_memory(device, per_block, config.gpu_memory_utilization)
        if device.type == "cuda" else DEFAULT_CPU_BLOCKS * model_dtype_block // per_block)


def build_draft(config: EngineConfig, target_vocab: int, ops, device: torch.device,
                dtype: torch.dtype, num_blocks: int, max_model_len: int) -> DraftRunner | None:
    """The draft model and its KV pool for method draft_model (else None). Its pool holds
    what the running requests can use (max_num_seqs full-length requests: only running
    requests hold draft blocks when a proposal takes more), at most the target's block
    count: on CPU the two are alike, on CUDA the target's count comes from the GPU's
    memory and is far more than a draft needs. Its chains are sized for the k the
    engine starts with (the live knob num_speculative_tokens)."""
    spec = config.speculative_config
    if spec is None or spec.method != "draft_model":
        return None
    per_seq = -(-max_model_len // config.block_size)
    blocks = min(num_blocks, config.scheduler.max_num_seqs * per_seq)
    graphs = device.type == "cuda" and not config.enforce_eager \
        and ops.__name__ == "kernels.triton_ops"
    return build_draft_runner(spec.model, target_vocab, ops, device, dtype, blocks,
                              config.block_size, config.seed,
                              max_rows=config.scheduler.max_num_seqs,
                              max_chain=config.scheduler.num_speculative_tokens + 1,
                              use_graphs=graphs)


def verify_rows(config: EngineConfig) -> int:
    """Decode rows of the widest verify step of the k the engine starts with (every
    running request with k drafts, the drafts within the token budget; no more requests
    than disable_by_batch_size, past which a step drafts nothing): the CUDA graphs
    capture verify steps up to that many rows (capped by the largest decode bucket); 0
    when it starts without speculation (a k or budget set larger live runs the mixed
    graphs or eagerly)."""
    sched = config.scheduler
    if not sched.num_speculative_tokens:
        return 0
    seqs = sched.max_num_seqs
    off = (config.speculative_config or SpeculativeConfig()).disable_by_batch_size
    if off is not None:
        seqs = min(seqs, off)
    return min(seqs * (1 + sched.num_speculative_tokens),
               max(sched.max_num_seqs, sched.max_num_batched_tokens))


def host_kv_bytes(config: EngineConfig, bytes_per_block: int) -> int:
    """This rank's bytes of the host KV tier; a kv_offloading_size that holds no block is
    refused (the tier was left out without a word)."""
    size = int(config.kv_offloading_size * 2 ** 30) // config.tensor_parallel_size
    if 0 < size < bytes_per_block:
        block = bytes_per_block * config.tensor_parallel_size
        raise InvalidRequestError(
            f"kv_offloading_size {config.kv_offloading_size:g} GiB holds no KV block (one "
            f"is {block} bytes, {block / 2 ** 30:.3g} GiB): give at least that, or 0 for no "
            f"host tier")
    return size


def _build_runner(config: EngineConfig, device: torch.device, dtype: torch.dtype,
                  loaded: LoadedModel, backend: str, group, defaults: dict) -> WorkerSetup:
    max_model_len = resolve_max_model_len(config.max_model_len, context_length(loaded.hf_config))
    ops = get_ops(backend)
    # the pool's bytes a block in kv_cache_dtype, and in the model's dtype (CPU sizing)
    sizes = [kv_bytes_per_block(loaded.model, config.block_size, t) for t in
             (resolve_kv_cache_dtype(config.kv_cache_dtype, dtype, device), dtype)]
    num_blocks = _num_blocks(config, device, *sizes)
    draft = build_draft(config, loaded.model.config.vocab_size, ops, device, dtype,
                        num_blocks, max_model_len)
    if draft is not None:
        num_blocks = _num_blocks(config, device, *sizes)   # the draft is resident
    # TP: every rank runs the same ModelRunner on the same StepBatch (same graph
    # buckets, so the NCCL all-reduces of captured graphs match) and samples alike
    runner_kw = dict(max_model_len=max_model_len, use_cuda_graphs=not config.enforce_eager,
                     graph_safe_ops=backend == "triton",
                     async_scheduling=config.async_scheduling,
                     max_graph_batch=max(config.scheduler.max_num_seqs, 256),
                     max_verify_rows=verify_rows(config),
                     max_mixed_graph_tokens=config.scheduler.max_num_batched_tokens
                     if config.cudagraph_mode == "full" else 0, seed=config.sampler_seed,
                     logprobs_mode=config.logprobs_mode, kv_cache_dtype=config.kv_cache_dtype,
                     calculate_kv_scales=config.calculate_kv_scales)
    # the host KV tier: each rank holds its shard of every host block
    runner_kw["host_kv_bytes"] = host_kv_bytes(config, sizes[0])
    if group is not None:
        group.allocate_kv(num_blocks, config.block_size, **runner_kw)
    runner = ModelRunner(loaded.model, ops, device, dtype, num_blocks, config.block_size,
                         **runner_kw)
    return WorkerSetup(loaded, backend, max_model_len, num_blocks, draft, runner, group,
                       defaults)
