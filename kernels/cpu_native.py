"""The native CPU backend ("cpu_native", the CPU default where it builds): the CPU
backend (kernels/cpu_ops.py) with a decode step's hot ops in C (kernels/cpu_native.c).

- Skinny linears (at most NATIVE_MAX_ROWS rows, float32): one pass over weights packed
  once into 16-column panels, with the RMSNorm (and residual add) or SiLU-mul that
  precede a projection computed while its input is read. Weights are kept in float16
  (or bfloat16) only where that dtype holds each of them exactly, as the bundled
  float16 checkpoint's do: half the bytes to stream each step, the same products.
- Decode attention: rotary, the KV store and paged attention in one call per layer,
  reading K/V straight from their blocks (no gather copy, no mask).

Anything else (wide prefill inputs, other dtypes, strided layouts, non-Neox rotary,
extend attention) goes to kernels/cpu_ops.py unchanged. Same signatures and semantics
(tests/kernels/test_cpu_native.py); docs/KERNELS.md "CPU native" and docs/PERF.md say why.
"""
from __future__ import annotations

import torch

from kernels import cpu_ops
from kernels.cpu_native_build import load
from kernels.cpu_ops import (argmax, paged_extend_attention, rms_norm,  # noqa: F401
                             rotary_embedding, rotary_store_kv, silu_and_mul, store_kv_cache,
                             top_logprobs)

NATIVE_MAX_ROWS = 32            # wider inputs (prefill chunks) use oneDNN / MKL
_W_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_PLAIN, _RMS_NORM, _SILU_MUL = 0, 1, 2
MAX_GROUP = 64                  # query heads per KV head the C attention holds
_LIB = load()                   # built on first import (about a second), then cached


def available() -> bool:
    return _LIB is not None


def _narrowest_exact(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] float32 as float16 or bfloat16 where that holds every value exactly,
    else as it is."""
    for dtype in (torch.float16, torch.bfloat16):
        narrow = weight.to(dtype)
        if torch.equal(narrow.float(), weight):
            return narrow
    return weight


def packed_panels(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] as [ceil(N/16), K, 16] panels (zero columns past N) in its narrowest
    exact dtype, made once and kept on the tensor (repacked if it changes in place)."""
    cached = getattr(weight, "_native_panels", None)
    if cached is not None and cached[0] == weight._version:
        return cached[1]
    with torch.inference_mode():
        n, k = weight.shape
        padded = weight.new_zeros(-(-n // 16) * 16, k)
        padded[:n] = weight
        narrow = _narrowest_exact(padded)
        panels = narrow.view(-1, 16, k).transpose(1, 2).contiguous()
    weight._native_panels = (weight._version, panels)
    return panels


def _rows(x: torch.Tensor, width: int) -> torch.Tensor | None:
    """x as [M, width] rows the kernel can read (unit column stride), or None."""
    if x.dtype != torch.float32 or x.device.type != "cpu" or x.shape[-1] != width:
        return None
    rows = x.reshape(-1, width)
    if rows.shape[0] > NATIVE_MAX_ROWS or rows.shape[0] == 0 or rows.stride(-1) != 1:
        return None
    return rows


def _weight_ok(weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    return (weight.dtype == torch.float32 and weight.device.type == "cpu" and weight.dim() == 2
            and (bias is None or (bias.dtype == torch.float32 and bias.is_contiguous())))


def _check(status: int, what: str) -> None:
    """A C call's status as the exception it stands for (0: done)."""
    if status == -2:
        raise IndexError(f"native {what}: a position, slot, block table entry or context "
                         "length is out of range")
    if status != 0:
        raise MemoryError(f"native {what}: out of memory for its scratch buffers")


def _run_linear(rows: torch.Tensor, k: int, weight: torch.Tensor, bias, mode: int,
                norm_weight=None, eps: float = 0.0, residual=None, new_residual=None):
    panels = packed_panels(weight)
    n = weight.shape[0]
    y = torch.empty(rows.shape[0], n)
    status = _LIB.rp_linear(
        rows.data_ptr(), rows.shape[0], k, rows.stride(0), panels.data_ptr(),
        _W_CODES[panels.dtype], n, None if bias is None else bias.data_ptr(), y.data_ptr(), n,
        mode, None if norm_weight is None else norm_weight.data_ptr(), eps,
        None if residual is None else residual.data_ptr(), 0 if residual is None else k,
        None if new_residual is None else new_residual.data_ptr(), k)
    _check(status, "linear")
    return y


def linear(x: torch.Tensor, weight: torch.Tensor,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ weight^T + bias (as F.linear)."""
    k = weight.shape[-1]
    rows = _rows(x, k) if _LIB is not None and _weight_ok(weight, bias) else None
    if rows is None:
        return cpu_ops.linear(x, weight, bias)
    return _run_linear(rows, k, weight, bias, _PLAIN).view(*x.shape[:-1], weight.shape[0])


def rms_norm_linear(x: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                    weight: torch.Tensor, bias: torch.Tensor | None = None,
                    residual: torch.Tensor | None = None):
    """linear(rms_norm(x [+ residual]), weight, bias); with residual also x + residual."""
    k = weight.shape[-1]
    ok = (_LIB is not None and _weight_ok(weight, bias) and x.dim() == 2 and x.is_contiguous()
          and norm_weight.dtype == torch.float32 and norm_weight.is_contiguous()
          and (residual is None or (residual.shape == x.shape and residual.is_contiguous()
                                    and residual.dtype == torch.float32)))
    rows = _rows(x, k) if ok else None
    if rows is None:
        return cpu_ops.rms_norm_linear(x, norm_weight, eps, weight, bias, residual)
    new_residual = None if residual is None else torch.empty_like(x)
    y = _run_linear(rows, k, weight, bias, _RMS_NORM, norm_weight, eps, residual, new_residual)
    return y if residual is None else (y, new_residual)


def silu_mul_linear(x: torch.Tensor, weight: torch.Tensor,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    """linear(silu_and_mul(x), weight, bias): x [T, 2K] = [gate | up], weight [N, K]."""
    k = weight.shape[-1]
    ok = _LIB is not None and _weight_ok(weight, bias) and x.dim() == 2
    rows = _rows(x, 2 * k) if ok else None
    if rows is None:
        return cpu_ops.silu_mul_linear(x, weight, bias)
    return _run_linear(rows, k, weight, bias, _SILU_MUL)


def _heads_ok(t: torch.Tensor) -> bool:
    """[T, H, D] float32 with heads D apart and unit stride inside a head."""
    return (t.dtype == torch.float32 and t.dim() == 3 and t.device.type == "cpu"
            and t.stride(2) == 1 and t.stride(1) == t.shape[2])


def _cache_ok(n_tokens: int, n_heads: int, k_cache, v_cache, block_tables,
              context_lens) -> bool:
    """The paged caches and a decode step's tables as the C attention reads them, for
    n_tokens decodes of n_heads query heads."""
    n_kv = k_cache.shape[2] if k_cache.dim() == 4 else 0
    return (_LIB is not None and n_kv > 0 and n_heads % n_kv == 0
            and n_heads // n_kv <= MAX_GROUP and k_cache.dtype == v_cache.dtype == torch.float32
            and k_cache.is_contiguous() and v_cache.is_contiguous()
            and block_tables.dtype == torch.int32 and block_tables.dim() == 2
            and block_tables.stride(-1) == 1
            and context_lens.dtype == torch.int32 and context_lens.is_contiguous()
            and n_tokens == block_tables.shape[0] == context_lens.shape[0])


def _rotary_ok(n_tokens: int, head_dim: int, positions, slot_mapping, cos_sin) -> bool:
    """Positions, slots and the [cos | sin] cache as the C rotary + store reads them."""
    return (positions.dtype == slot_mapping.dtype == torch.int64 and positions.is_contiguous()
            and slot_mapping.is_contiguous() and cos_sin.dtype == torch.float32
            and cos_sin.is_contiguous() and cos_sin.shape[-1] == head_dim
            and positions.shape[0] == slot_mapping.shape[0] == n_tokens)


def _decode(q, k, v, positions, cos_sin, slots, k_cache, v_cache, block_tables,
            context_lens, scale: float) -> torch.Tensor:
    batch, n_heads, head_dim = q.shape
    out = torch.empty(batch, n_heads, head_dim)
    if batch == 0:
        return out
    ptr = (lambda t: None if t is None else t.data_ptr())
    status = _LIB.rp_decode_attention(
        batch, n_heads, k_cache.shape[2], head_dim, q.data_ptr(), q.stride(0), ptr(k),
        0 if k is None else k.stride(0), ptr(v), 0 if v is None else v.stride(0),
        ptr(positions), ptr(cos_sin), 0 if cos_sin is None else cos_sin.shape[0], ptr(slots),
        k_cache.data_ptr(), v_cache.data_ptr(), k_cache.shape[0], k_cache.shape[1],
        block_tables.data_ptr(), block_tables.stride(0), block_tables.shape[1],
        context_lens.data_ptr(), scale, out.data_ptr())
    _check(status, "decode attention")
    return out


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           scale: float) -> torch.Tensor:
    """As reference.paged_decode_attention: q [B, H, D] -> [B, H, D]."""
    if not (_heads_ok(q) and _cache_ok(q.shape[0], q.shape[1], k_cache, v_cache,
                                       block_tables, context_lens)):
        return cpu_ops.paged_decode_attention(q, k_cache, v_cache, block_tables,
                                              context_lens, scale)
    return _decode(q, None, None, None, None, None, k_cache, v_cache, block_tables,
                   context_lens, scale)


def rotary_decode_attention(positions, query, key, value, cos_sin_cache, is_neox: bool,
                            k_cache, v_cache, slot_mapping, block_tables, context_lens,
                            scale: float, **knobs) -> torch.Tensor:
    """As reference.rotary_decode_attention: rotary, K/V stored at slot_mapping (-1:
    not stored), then decode attention of the rotated query."""
    t, n_heads, head_dim = query.shape if query.dim() == 3 else (0, 0, 0)
    ok = (is_neox and _heads_ok(query) and _heads_ok(key) and _heads_ok(value)
          and _cache_ok(t, n_heads, k_cache, v_cache, block_tables, context_lens)
          and _rotary_ok(t, head_dim, positions, slot_mapping, cos_sin_cache))
    if not ok:
        return cpu_ops.rotary_decode_attention(positions, query, key, value, cos_sin_cache,
                                               is_neox, k_cache, v_cache, slot_mapping,
                                               block_tables, context_lens, scale, **knobs)
    return _decode(query, key, value, positions, cos_sin_cache, slot_mapping, k_cache,
                   v_cache, block_tables, context_lens, scale)


def _layer_weights(layer) -> tuple | None:
    """The C layer's weight arguments (packed panels, dtype codes, biases, norms) for a
    Llama decoder layer, kept on the layer until a weight changes in place; None where
    a weight or bias does not fit the kernels."""
    projections = (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj)
    norms = (layer.input_layernorm, layer.post_attention_layernorm)
    key = tuple(p.weight._version for p in projections) + tuple(n._version for n in norms)
    cached = getattr(layer, "_native_args", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    args = None
    if (all(_weight_ok(p.weight, p.bias) for p in projections)
            and all(n.dtype == torch.float32 and n.is_contiguous() for n in norms)):
        panels = [packed_panels(p.weight) for p in projections]
        triples = [(w.data_ptr(), _W_CODES[w.dtype], None if p.bias is None else p.bias.data_ptr())
                   for w, p in zip(panels, projections)]
        args = (norms[0].data_ptr(), norms[1].data_ptr(), *triples[0], *triples[1],
                *triples[2], layer.down_proj.weight.shape[1], *triples[3])
        args = (args, panels)                   # the panels stay referenced with their pointers
    layer._native_args = (key, args)
    return args


def llama_decode_layer(layer, positions: torch.Tensor, hidden: torch.Tensor,
                       residual: torch.Tensor | None, meta, cos_sin: torch.Tensor, eps: float):
    """A Llama decoder layer (engine/worker/models/llama.py) on a decode-only step in one C call:
    (hidden, residual) out, or None where the step or the layer does not fit (the model
    then runs its ops one by one)."""
    attn, t = layer.attn, hidden.shape[0]
    k_cache, v_cache = attn.k_cache, attn.v_cache
    tables, lens, slots = meta.decode_block_tables, meta.decode_context_lens, meta.slot_mapping
    if (not 0 < t <= NATIVE_MAX_ROWS or hidden.dtype != torch.float32
            or not hidden.is_contiguous() or hidden.dim() != 2
            or (residual is not None and not residual.is_contiguous())
            or tables is None or lens is None
            or not _cache_ok(t, layer.num_heads, k_cache, v_cache, tables, lens)
            or not _rotary_ok(t, layer.head_dim, positions, slots, cos_sin)):
        return None
    weights = _layer_weights(layer)
    if weights is None:
        return None
    args, _ = weights
    out, new_residual = torch.empty_like(hidden), torch.empty_like(hidden)
    status = _LIB.rp_llama_decode_layer(
        t, hidden.shape[1], hidden.data_ptr(), None if residual is None else residual.data_ptr(),
        new_residual.data_ptr(), out.data_ptr(), eps, *args, layer.num_heads,
        layer.num_kv_heads, layer.head_dim, positions.data_ptr(), cos_sin.data_ptr(),
        cos_sin.shape[0], slots.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
        k_cache.shape[0], k_cache.shape[1], tables.data_ptr(), tables.stride(0),
        tables.shape[1], lens.data_ptr(), attn.scale)
    _check(status, "decoder layer")
    return out, new_residual
