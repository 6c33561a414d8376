"""Tensor-parallel building blocks: who holds which slice of a weight, and the collectives.

A sharded parameter carries a `Shard` (how its full, TP=1 tensor maps onto this rank's
slice), so the loader reads only the rank's slice of a checkpoint tensor and dummy weights
are the TP=1 tensors sliced. Collectives run on the default process group (NCCL on CUDA,
whose all_reduce / all_gather_into_tensor CUDA graphs capture; gloo on CPU). At TP=1
models never call into this module's collectives.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from engine.config import InvalidRequestError


@dataclass(frozen=True)
class TPInfo:
    """This process's place in the tensor-parallel group."""

    rank: int = 0
    size: int = 1


@dataclass(frozen=True)
class Segment:
    """One fused part of a parameter: `full` rows in the TP=1 tensor, of which this rank
    holds [start, start + length) (past `full`: zero padding, e.g. the vocab's tail)."""

    full: int
    start: int
    length: int


@dataclass(frozen=True)
class Shard:
    """How a parameter's TP=1 tensor maps onto this rank's: split along `dim`, one segment
    per fused part (q|k|v, gate|up), in the parameter's order."""

    dim: int
    segments: tuple[Segment, ...]

    def full_shape(self, local_shape: torch.Size) -> tuple[int, ...]:
        shape = list(local_shape)
        shape[self.dim] = sum(s.full for s in self.segments)
        return tuple(shape)

    def offset(self, index: int) -> int:
        """Where segment `index` starts in this rank's parameter."""
        return sum(s.length for s in self.segments[:index])


def split(full: int, tp: TPInfo, what: str) -> Segment:
    """Even split of `full` rows over the ranks; refuses a remainder."""
    if full % tp.size:
        raise InvalidRequestError(
            f"tensor_parallel_size {tp.size} does not divide {what} ({full})")
    n = full // tp.size
    return Segment(full, tp.rank * n, n)


def split_padded(full: int, tp: TPInfo) -> Segment:
    """Split of `full` rows (the vocab) padded up to a multiple of the ranks."""
    n = -(-full // tp.size)
    return Segment(full, tp.rank * n, n)


def kv_head_segment(num_kv_heads: int, head_dim: int, tp: TPInfo) -> Segment:
    """KV heads split across ranks; with more ranks than KV heads each rank holds one head,
    replicated over size // num_kv_heads ranks (as vLLM does)."""
    if tp.size <= num_kv_heads:
        seg = split(num_kv_heads, tp, "the KV heads")
    elif tp.size % num_kv_heads:
        raise InvalidRequestError(
            f"tensor_parallel_size {tp.size} exceeds the KV heads ({num_kv_heads}) and is not "
            f"a multiple of them")
    else:
        seg = Segment(num_kv_heads, tp.rank * num_kv_heads // tp.size, 1)
    return Segment(seg.full * head_dim, seg.start * head_dim, seg.length * head_dim)


def take(full: torch.Tensor, shard: Shard | None, index: int | None = None) -> torch.Tensor:
    """This rank's slice of a TP=1 tensor: of the whole parameter (index None, the full
    fused tensor) or of one fused part (`index`, the checkpoint tensor of that part)."""
    if shard is None:
        return full
    segments = shard.segments if index is None else (shard.segments[index],)
    parts, base = [], 0
    for seg in segments:
        rows = max(0, min(seg.length, seg.full - seg.start))
        part = full.narrow(shard.dim, base + seg.start, rows)
        if rows < seg.length:   # vocab padding past the last real row
            pad = list(part.shape)
            pad[shard.dim] = seg.length - rows
            part = torch.cat((part, part.new_zeros(pad)), dim=shard.dim)
        parts.append(part)
        base += seg.full if index is None else 0
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=shard.dim)


def mark(param: torch.nn.Parameter, shard: Shard | None) -> torch.nn.Parameter:
    """Attach a Shard to a parameter (None: replicated)."""
    param.tp_shard = shard
    return param


# -- collectives (only called when size > 1) -----------------------------------------------

def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum of the ranks' partial results (row-parallel outputs, vocab-parallel lookups)."""
    dist.all_reduce(x)
    return x


# torch >= 2.13 names it all_gather_single (all_gather_into_tensor: deprecated alias)
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def gather_vocab(local: torch.Tensor, tp: TPInfo, vocab_size: int) -> torch.Tensor:
    """[S, V/N] per rank -> [S, V] full logits on every rank (padding columns dropped).
    The single-tensor all-gather needs one fixed output shape: S is the same on every rank
    and, under CUDA graphs, fixed per captured batch size."""
    s, v_local = local.shape
    out = local.new_empty(tp.size * s, v_local)
    _all_gather_single(out, local.contiguous())
    # (the width spelled out: a step without sample rows, a prefill chunk, has s = 0)
    return out.view(tp.size, s, v_local).permute(1, 0, 2).reshape(s, tp.size * v_local)[
        :, :vocab_size].contiguous()


def vocab_embedding(ids: torch.Tensor, weight: torch.Tensor, tp: TPInfo) -> torch.Tensor:
    """Vocab-parallel lookup: rows this rank does not hold read as zero, then all-reduce."""
    start = tp.rank * weight.shape[0]
    local = ids - start
    outside = (local < 0) | (local >= weight.shape[0])
    hidden = torch.nn.functional.embedding(local.masked_fill(outside, 0), weight)
    hidden.masked_fill_(outside.unsqueeze(-1), 0)
    return all_reduce(hidden)


# -- linear layers ---------------------------------------------------------------------------

def column(linear: torch.nn.Linear, segments: tuple[Segment, ...]) -> torch.nn.Linear:
    """Column-parallel: output rows (each fused part's) split over ranks, bias too."""
    mark(linear.weight, Shard(0, segments))
    if linear.bias is not None:
        mark(linear.bias, Shard(0, segments))
    return linear


def row(linear: torch.nn.Linear, segment: Segment) -> torch.nn.Linear:
    """Row-parallel: input columns split over ranks; the bias is whole (added by rank 0)."""
    mark(linear.weight, Shard(1, (segment,)))
    return linear


def row_bias(linear: torch.nn.Linear, tp: TPInfo) -> torch.Tensor | None:
    """A row-parallel layer's bias: added once, before the all-reduce, by rank 0."""
    return linear.bias if tp.rank == 0 else None
