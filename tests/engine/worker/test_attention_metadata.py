"""AttentionMetadata's decode order: made once per forward by the backend that uses it
(the Triton decode launch, docs/KERNELS.md "Longest first") and shared by every layer;
nothing for a backend without it."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from engine.worker.models.layers import AttentionMetadata
from kernels import reference


def test_the_order_is_made_once_and_shared_by_every_layer():
    calls = []

    def decode_order(lens):
        calls.append(lens)
        return torch.argsort(lens, descending=True).to(torch.int32)

    ops = SimpleNamespace(decode_order=decode_order)
    lens = torch.tensor([3, 9, 5], dtype=torch.int32)
    meta = AttentionMetadata(slot_mapping=torch.zeros(3, dtype=torch.int64),
                             num_decode_tokens=3, decode_context_lens=lens)
    first = meta.order_kwargs(ops)
    assert first["order"].tolist() == [1, 2, 0]
    assert all(meta.order_kwargs(ops) is first for _ in range(27))      # 28 layers, one sort
    assert len(calls) == 1


def test_a_backend_without_an_order_gets_none():
    meta = AttentionMetadata(slot_mapping=torch.zeros(2, dtype=torch.int64), num_decode_tokens=2,
                             decode_context_lens=torch.tensor([4, 7], dtype=torch.int32))
    assert meta.order_kwargs(reference) == {}
    prefill_only = AttentionMetadata(slot_mapping=torch.zeros(2, dtype=torch.int64),
                                     num_decode_tokens=0)
    assert prefill_only.order_kwargs(SimpleNamespace(decode_order=lambda lens: 1 / 0)) == {}
