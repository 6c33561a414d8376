"""Checkpoint tensors into (possibly sharded) parameters, shape-checked first.

A source is a torch tensor or a safetensors slice (`safe_open(...).get_slice(name)`): a
rank reads only the rows of its shard from disk. Every tensor's shape is checked against
the expected full (TP=1) shape before any slicing, so a wrong-shaped but broadcastable
tensor (embed_tokens [1, H]) is refused instead of loading as garbage.
"""
from __future__ import annotations

import torch

from engine.config import InvalidRequestError
from engine.worker.models.parallel import Shard


class Transposed:
    """A 2-D source read as its transpose (HF Conv1D stores [in, out]); slices still read
    only the requested rows of the file."""

    def __init__(self, source):
        self.source = source

    def get_shape(self) -> list[int]:
        return list(source_shape(self.source))[::-1]

    def __getitem__(self, index) -> torch.Tensor:
        index = index if isinstance(index, tuple) else (index,)
        rows, cols = (tuple(index) + (slice(None), slice(None)))[:2]
        return self.source[(cols, rows)].t()


def source_shape(source) -> tuple[int, ...]:
    if isinstance(source, torch.Tensor):
        return tuple(source.shape)
    return tuple(source.get_shape())


def read_rows(source, dim: int, start: int, stop: int) -> torch.Tensor:
    """Rows [start, stop) of `source` along dim 0 or 1 (only those are read from disk)."""
    index = (slice(start, stop),) if dim == 0 else (slice(None), slice(start, stop))
    return source[index]


def read_full(source, name: str, expected: tuple[int, ...]) -> torch.Tensor:
    check_shape(name, source, expected)
    return source if isinstance(source, torch.Tensor) else source[(slice(None),)]


def check_shape(name: str, source, expected: tuple[int, ...]) -> None:
    got = source_shape(source)
    if got != tuple(expected):
        raise InvalidRequestError(f"tensor {name!r} has shape {list(got)}, expected "
                                  f"{list(expected)}")


def load_param(param: torch.nn.Parameter, source, name: str, index: int | None = None) -> None:
    """Copy a checkpoint tensor (one fused part `index`, or the whole parameter) into this
    rank's slice of `param`."""
    shard: Shard | None = getattr(param, "tp_shard", None)
    if shard is None:
        param.data.copy_(read_full(source, name, tuple(param.shape)))
        return
    expected = list(shard.full_shape(param.shape))
    segments = shard.segments if index is None else (shard.segments[index],)
    if index is not None:
        expected[shard.dim] = segments[0].full
    check_shape(name, source, tuple(expected))
    dst = param.data.narrow(shard.dim, shard.offset(index or 0),
                            sum(s.length for s in segments))
    pos, base = 0, 0
    for seg in segments:
        rows = max(0, min(seg.length, seg.full - seg.start))
        part = dst.narrow(shard.dim, pos, seg.length)
        if rows:
            part.narrow(shard.dim, 0, rows).copy_(
                read_rows(source, shard.dim, base + seg.start, base + seg.start + rows))
        if rows < seg.length:   # vocab padding rows of the last rank
            part.narrow(shard.dim, rows, seg.length - rows).zero_()
        pos += seg.length
        base += seg.full
