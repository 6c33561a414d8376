"""Speculative decoding's verified positions as decode rows (docs/SPECULATIVE.md): the
rows of one request share its block-table row, each with context length position + 1.
With every row's K/V stored first, the decode attention of those rows equals the causal
extend attention of the same tokens (the torch reference) on each backend a verify step
runs: the reference, the CPU C kernel (it stores and attends row by row, in order, in
one call: rotary_decode_attention) and the Triton decode kernel (under the interpreter
without CUDA): store then attend, and the one fused launch with rows_shared, in which a
row takes its sequence's earlier rows from registers (bit-equal to store then attend,
wherever the new positions fall among tiles and splits)."""
import os

import pytest
import torch

from engine.worker.models.layers import rope_cos_sin_cache
from kernels import reference as ref

BLOCK, H_KV, GROUP, D = 4, 2, 2, 32
H = H_KV * GROUP
PREFIXES, NEW = [21, 6], [4, 3]       # cached tokens, then verified positions, per request


def _case(dtype: torch.dtype, device: str, prefixes=PREFIXES, new=NEW) -> dict:
    """Two requests with cached prefixes, their new rows' q/k/v, positions and slots, the
    extend layout (one sequence each) and the decode-row layout (one row a position)."""
    g = torch.Generator().manual_seed(7)
    rand = lambda *s: torch.randn(*s, generator=g).to(dtype).to(device)   # noqa: E731
    blocks = [-(-(p + n) // BLOCK) for p, n in zip(prefixes, new)]
    num_blocks = sum(blocks) + 2
    perm = torch.randperm(num_blocks, generator=g)
    tables = torch.zeros(2, max(blocks) + 1, dtype=torch.int32)
    tables[0, :blocks[0]], tables[1, :blocks[1]] = perm[:blocks[0]], perm[blocks[0]:sum(blocks)]
    positions = torch.cat([torch.arange(p, p + n) for p, n in zip(prefixes, new)])
    seq = torch.repeat_interleave(torch.arange(2), torch.tensor(new))
    slots = tables[seq, positions // BLOCK].long() * BLOCK + positions % BLOCK
    t = sum(new)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    return dict(
        k_cache=rand(num_blocks, BLOCK, H_KV, D), v_cache=rand(num_blocks, BLOCK, H_KV, D),
        q=rand(t, H, D), k=rand(t, H_KV, D), v=rand(t, H_KV, D),
        positions=positions.to(device), slots=slots.to(device),
        cos_sin=rope_cos_sin_cache(inv_freq, 64).to(device),
        tables=tables.to(device),
        cu=torch.tensor([0, new[0], t], dtype=torch.int32, device=device),
        lens=torch.tensor([p + n for p, n in zip(prefixes, new)], dtype=torch.int32,
                          device=device), max_new=max(new),
        row_tables=tables[seq].contiguous().to(device),          # the request's row, repeated
        row_lens=(positions + 1).to(torch.int32).to(device))


def _want(c: dict) -> torch.Tensor:
    """Reference: rotary + store, then the causal extend attention of each request."""
    kc, vc = c["k_cache"].clone(), c["v_cache"].clone()
    q = ref.rotary_store_kv(c["positions"], c["q"], c["k"], c["v"], c["cos_sin"], True, kc,
                            vc, c["slots"])
    return ref.paged_extend_attention(q, kc, vc, c["tables"], c["cu"], c["lens"],
                                      c["max_new"], D ** -0.5)


def _decode_rows(ops, c: dict, fused: bool, with_caches: bool = False, **knobs):
    """The decode rows' attention on copies of the caches: the one fused call with
    rows_shared, or rotary_store_kv then the decode attention; with_caches: (output,
    k cache, v cache)."""
    kc, vc = c["k_cache"].clone(), c["v_cache"].clone()
    args = (c["positions"], c["q"], c["k"], c["v"], c["cos_sin"], True, kc, vc, c["slots"])
    if fused:
        out = ops.rotary_decode_attention(*args, c["row_tables"], c["row_lens"], D ** -0.5,
                                          rows_shared=True, **knobs)
    else:
        q = ops.rotary_store_kv(*args)
        out = ops.paged_decode_attention(q, kc, vc, c["row_tables"], c["row_lens"],
                                         D ** -0.5, **knobs)
    return (out, kc, vc) if with_caches else out


def _check(got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    assert got.shape == want.shape and not torch.isnan(got).any()
    assert torch.allclose(got.float().cpu(), want.float().cpu(), atol=tol, rtol=tol), \
        (got.float().cpu() - want.float().cpu()).abs().max()


def test_reference_decode_rows_equal_extend():
    c = _case(torch.float32, "cpu")
    _check(_decode_rows(ref, c, fused=False), _want(c), 1e-5)


def test_cpu_native_decode_rows_in_one_call_equal_extend():
    from kernels import cpu_native
    if not cpu_native.available():
        pytest.skip("the CPU C kernels did not build")
    c = _case(torch.float32, "cpu")
    _check(_decode_rows(cpu_native, c, fused=True), _want(c), 1e-5)


def test_reference_fused_call_with_shared_rows_equals_extend():
    c = _case(torch.float32, "cpu")
    _check(_decode_rows(ref, c, fused=True), _want(c), 1e-5)


# The Triton tests run on the interpreter (the CPU suite, TRITON_INTERPRET=1) and on the
# GPU (gpu-marked, so scripts/gpu_phases.sh's `-m gpu` runs them where programs of one
# launch really race)
BACKENDS = [pytest.param("interpreter"), pytest.param("cuda", marks=pytest.mark.gpu)]


def _triton(backend: str):
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if (backend == "interpreter") != interpreted:
        pytest.skip("the interpreter runs in the CPU suite, the GPU case on CUDA")
    if interpreted:
        import tests.kernels.kernel_helpers  # noqa: F401  (its interpreter patch)
    from kernels import get_ops
    return get_ops("triton"), "cpu" if interpreted else "cuda"


@pytest.mark.parametrize("backend", BACKENDS)
def test_triton_decode_rows_after_the_store_equal_extend(backend):
    tri, device = _triton(backend)
    c = _case(torch.float32, device)
    want = _want({k: v.cpu() if torch.is_tensor(v) else v for k, v in c.items()})
    _check(_decode_rows(tri, c, fused=False), want, 1e-4)


# prefixes / verified rows: the new positions inside one tile, across a 16-token tile
# boundary (14 + 4) and a split's; knobs: one tile a split, 16-token tiles in 2 or 3
# splits (the early tile and the loop's tiles both take new positions)
@pytest.mark.parametrize("prefixes,new", [([21, 6], [4, 3]), ([14, 30], [4, 2]),
                                          ([0, 47], [3, 1])])
@pytest.mark.parametrize("knobs", [{}, {"block_n": 16, "num_splits": 2},
                                   {"block_n": 16, "num_splits": 3}])
@pytest.mark.parametrize("backend", BACKENDS)
def test_triton_fused_shared_rows_equal_the_store_then_attend(prefixes, new, knobs, backend):
    """One launch for a verify step (rows_shared): each row takes the K/V of its
    sequence's earlier rows from their rotated keys and values, bit-equal to storing every
    row first and then attending, and equal to the causal extend. The programs run the
    rows last first (the `order` knob), so under the interpreter, which runs programs one
    after another, a row that read its earlier rows from the cache would read them before
    their store."""
    tri, device = _triton(backend)
    c = _case(torch.float32, device, prefixes, new)
    want = _want({k: v.cpu() if torch.is_tensor(v) else v for k, v in c.items()})
    rows = c["positions"].shape[0]
    knobs["order"] = torch.arange(rows - 1, -1, -1, dtype=torch.int32, device=device)
    fused = _decode_rows(tri, c, fused=True, **knobs)
    assert torch.equal(fused, _decode_rows(tri, c, fused=False, **knobs))
    _check(fused, want, 1e-4)


def _random_layout(seed: int, device: str) -> dict:
    """1-4 requests of 1-4 rows each (1: a plain decode row), prefixes of 0-40 tokens,
    the first requests sharing their prefix's full blocks (the prefix cache's layout:
    shared blocks are full and never written), then 0-2 padding rows (slot -1, context 1,
    a block of their own)."""
    g = torch.Generator().manual_seed(seed)
    rint = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=g))   # noqa: E731
    n_req = rint(1, 4)
    rows = [rint(1, 4) for _ in range(n_req)]
    prefixes = [rint(0, 40) for _ in range(n_req)]
    width = -(-(max(p + n for p, n in zip(prefixes, rows))) // BLOCK) + 1
    free = iter(torch.randperm(n_req * width + 8, generator=g).tolist())
    pad_block = next(free)
    shared = [next(free) for _ in range(min(prefixes) // BLOCK)] if n_req > 1 else []
    tables = torch.zeros(n_req, width, dtype=torch.int32)
    for r, (p, n) in enumerate(zip(prefixes, rows)):
        for b in range(-(-(p + n) // BLOCK)):
            tables[r, b] = shared[b] if b < len(shared) else next(free)
    num_blocks = n_req * width + 8
    positions = torch.cat([torch.arange(p, p + n) for p, n in zip(prefixes, rows)])
    seq = torch.repeat_interleave(torch.arange(n_req), torch.tensor(rows))
    slots = tables[seq, positions // BLOCK].long() * BLOCK + positions % BLOCK
    row_tables, lens = tables[seq], positions + 1
    pads = rint(0, 2)
    if pads:
        pad_table = torch.full((pads, width), pad_block, dtype=torch.int32)
        row_tables = torch.cat((row_tables, pad_table))
        positions = torch.cat((positions, torch.zeros(pads, dtype=torch.long)))
        slots = torch.cat((slots, torch.full((pads,), -1, dtype=torch.long)))
        lens = torch.cat((lens, torch.ones(pads, dtype=torch.long)))
    t = positions.shape[0]
    rand = lambda *s: torch.randn(*s, generator=g).to(device)   # noqa: E731
    inv_freq = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    return dict(k_cache=rand(num_blocks, BLOCK, H_KV, D), v_cache=rand(num_blocks, BLOCK, H_KV, D),
                q=rand(t, H, D), k=rand(t, H_KV, D), v=rand(t, H_KV, D),
                positions=positions.to(device), slots=slots.to(device),
                cos_sin=rope_cos_sin_cache(inv_freq, 64).to(device),
                row_tables=row_tables.contiguous().to(device),
                row_lens=lens.to(torch.int32).to(device),
                order=torch.randperm(t, generator=g).to(torch.int32).to(device))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("backend", BACKENDS)
def test_triton_fused_shared_rows_on_random_layouts(seed, backend):
    """Requests of several rows beside plain decode rows, prefix blocks shared between
    requests, padding rows, programs in a random order, 16-token tiles in 2 splits: the
    fused launch with rows_shared equals storing every row first, bit for bit (outputs
    and caches): no row takes another sequence's positions as its own, and none misses
    its own sequence's."""
    tri, device = _triton(backend)
    c = _random_layout(seed, device)
    knobs = dict(block_n=16, num_splits=2, order=c.pop("order"))
    fused = _decode_rows(tri, c, fused=True, with_caches=True, **knobs)
    stored_first = _decode_rows(tri, c, fused=False, with_caches=True, **knobs)
    assert torch.equal(fused[0], stored_first[0]), f"seed {seed}"
    assert torch.equal(fused[1], stored_first[1]) and torch.equal(fused[2], stored_first[2])
